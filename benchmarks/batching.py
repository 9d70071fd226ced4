"""Dynamic batching at c=32: the same batched model with and without `dynamic_batching`, on the
bridge next to real Triton serving the same repository.

The model's `execute` costs a fixed 2 ms per call plus a little numpy per row (what a GPU kernel
launch or a vectorised library call looks like), so grouping requests pays off. Each cell sends
requests from `--concurrency` client threads for `--seconds` after a short warm-up.

    python -m benchmarks.batching                       # triton and bridge, c=32, 3 s per cell
    python -m benchmarks.batching --servers bridge --seconds 1 --concurrency 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from benchmarks.closed_loop import closed_loop
from benchmarks.servers import make_targets, start_targets, stop_targets

MODEL_PY = """
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        arrays = [pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() for r in requests]
        time.sleep(0.002)  # the fixed cost of one call
        batch = np.concatenate(arrays)
        result = np.tanh(batch) * 2.0
        sizes = [a.shape[0] for a in arrays]
        responses = []
        for part in np.split(result, np.cumsum(sizes)[:-1]):
            rows = np.full((part.shape[0], 1), batch.shape[0], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", part.astype(np.float32)), pb_utils.Tensor("ROWS", rows)]
            ))
        return responses
"""

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 32
{batching}
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 16 ] }} ]
output [
  {{ name: "OUT", data_type: TYPE_FP32, dims: [ 16 ] }},
  {{ name: "ROWS", data_type: TYPE_INT32, dims: [ 1 ] }}
]
"""

MODELS = {
    "no_batching": "",
    "dynamic_batching": "dynamic_batching { max_queue_delay_microseconds: 1000 }",
}


def write_repository(root: Path) -> Path:
    for name, batching in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name, batching=batching))
        (root / name / "1" / "model.py").write_text(MODEL_PY)
    return root


def measure(url: str, model: str, concurrency: int, seconds: float) -> dict:
    """Closed-loop load from `concurrency` threads; latencies in ms and the mean rows per call."""
    data = np.random.default_rng(0).random((1, 16), dtype=np.float32)

    def inputs() -> list[grpcclient.InferInput]:
        tensor = grpcclient.InferInput("IN", [1, 16], "FP32")
        tensor.set_data_from_numpy(data)
        return [tensor]

    load = closed_loop(
        url, model, inputs, concurrency, seconds, keep=lambda r: int(r.as_numpy("ROWS")[0, 0])
    )
    summary = load.summary()
    if load.results:
        summary["rows_per_call"] = statistics.mean(load.results)
    return summary


def format_table(results: dict[str, dict[str, dict]], concurrency: int) -> str:
    lines = [
        f"| model (c={concurrency}) | server | req/s | p50 ms | p99 ms | rows per execute "
        "| errors |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for model, by_server in results.items():
        for server, r in by_server.items():
            if r.get("throughput") is None:
                lines.append(f"| {model} | {server} | n/a | | | | {r.get('reason', r)} |")
                continue
            lines.append(
                f"| {model} | {server} | {r['throughput']:.0f} | {r['p50_ms']:.1f} | "
                f"{r['p99_ms']:.1f} | {r['rows_per_call']:.1f} | {r['errors']} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="triton,bridge")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    names = [n for n in args.servers.split(",") if n]
    if not names or set(names) - {"triton", "bridge"}:
        parser.error(f"servers: triton and/or bridge (got {args.servers})")

    results: dict[str, dict[str, dict]] = {model: {} for model in MODELS}
    with tempfile.TemporaryDirectory(prefix="bench-batching-") as tmp:
        repository = write_repository(Path(tmp) / "repository")
        targets = make_targets(names, Path(tmp) / "logs")
        try:
            start_targets(targets, repository, list(MODELS))
            for model in MODELS:
                for target in targets:
                    if target.server is None:
                        results[model][target.name] = {"reason": target.reason}
                        continue
                    results[model][target.name] = measure(
                        target.url, model, args.concurrency, args.seconds
                    )
        finally:
            stop_targets(targets)
    print(format_table(results, args.concurrency))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
