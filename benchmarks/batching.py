"""Dynamic batching at c=32: the same batched model with and without `dynamic_batching`, on
a door next to real Triton serving the same repository.

The model's `execute` costs a fixed 2 ms per call plus a little numpy per row (what a GPU kernel
launch or a vectorised library call looks like), so grouping requests pays off. Each cell sends
requests from `--concurrency` client threads for `--seconds` in all, split into `--rounds`
turns that go round the cells (model × server) in turn, so outside load hits each alike. Each
comparison is paired per round (dynamic ÷ no batching on one server, a door ÷ Triton on one
model) and reported as the median and range over rounds.

    python -m benchmarks.batching                       # triton and the door, c=32, 8 s per cell
    python -m benchmarks.batching --servers triton,door,bridge   # also Dynamo's frontend
    python -m benchmarks.batching --servers door --seconds 1 --concurrency 8 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from benchmarks.closed_loop import LoadResult, closed_loop, pooled
from benchmarks.placement import PIN_CHOICES, choose, describe
from benchmarks.servers import make_targets, start_targets, stop_targets
from benchmarks.spread import comparison_lines, paired, spread

# The servers that run a repository's models (the bare floors of grpc_floor.py do not).
SERVERS = ("triton", "door", "door_split", "bridge")

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


def measure(url: str, model: str, concurrency: int, seconds: float) -> LoadResult:
    """One turn of closed-loop load from `concurrency` threads; `results` are the rows per call
    each answer reports."""
    data = np.random.default_rng(0).random((1, 16), dtype=np.float32)

    def inputs() -> list[grpcclient.InferInput]:
        tensor = grpcclient.InferInput("IN", [1, 16], "FP32")
        tensor.set_data_from_numpy(data)
        return [tensor]

    return closed_loop(
        url,
        model,
        inputs,
        concurrency,
        seconds,
        keep=lambda r: int(r.as_numpy("ROWS")[0, 0]),
        warmup=min(1.0, seconds / 2),
    )


def summarize(turns: list[LoadResult]) -> dict:
    """The pooled figures of one model on one server, and its throughput per round."""
    load = pooled(turns)
    summary = load.summary()
    if load.results:
        summary["rows_per_call"] = statistics.mean(load.results)
    summary["turn_throughput"] = [t.summary()["throughput"] for t in turns]
    return summary


def paired_figures(results: dict[str, dict[str, dict]]) -> dict[str, dict]:
    """Per-round ratios of throughput: what batching gains on each server, and each server
    against Triton on each model."""
    out: dict[str, dict] = {}
    servers = list(dict.fromkeys(s for by_server in results.values() for s in by_server))
    for server in servers:
        on, off = results["dynamic_batching"].get(server), results["no_batching"].get(server)
        if on and off and on.get("turn_throughput") and off.get("turn_throughput"):
            rounds = paired(on["turn_throughput"], off["turn_throughput"])
            out[f"{server}: dynamic ÷ no batching"] = spread(rounds)
    for model, by_server in results.items():
        triton = by_server.get("triton")
        for server, figures in by_server.items():
            if server == "triton" or not (triton and triton.get("turn_throughput")):
                continue
            if figures.get("turn_throughput"):
                rounds = paired(figures["turn_throughput"], triton["turn_throughput"])
                out[f"{model}: {server} ÷ triton"] = spread(rounds)
    return out


def format_table(
    results: dict[str, dict[str, dict]], concurrency: int, comparisons: dict[str, dict]
) -> str:
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
    lines += comparison_lines("throughput", comparisons)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--servers", default="triton,door", help=f"of {', '.join(SERVERS)} (default triton,door)"
    )
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=8.0, help="per cell, over all rounds")
    parser.add_argument("--rounds", type=int, default=4, help="turns per cell (default 4)")
    parser.add_argument("--pin", choices=PIN_CHOICES, default="auto")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    names = [n for n in args.servers.split(",") if n]
    if not names or set(names) - set(SERVERS):
        parser.error(f"servers: some of {', '.join(SERVERS)} (got {args.servers})")
    if args.rounds < 1 or args.seconds <= 0:
        parser.error("--rounds and --seconds must be positive")

    placement = choose(args.pin)
    turns: dict[str, dict[str, list[LoadResult]]] = {model: {} for model in MODELS}
    results: dict[str, dict[str, dict]] = {model: {} for model in MODELS}
    with tempfile.TemporaryDirectory(prefix="bench-batching-") as tmp:
        repository = write_repository(Path(tmp) / "repository")
        targets = make_targets(names, Path(tmp) / "logs")
        try:
            start_targets(targets, repository, list(MODELS), placement)
            live = [t for t in targets if t.server is not None]
            cells = [(model, target) for model in MODELS for target in live]
            for round_index in range(args.rounds):
                shift = round_index % max(len(cells), 1)  # who goes first rotates
                for model, target in cells[shift:] + cells[:shift]:
                    turn = measure(target.url, model, args.concurrency, args.seconds / args.rounds)
                    turns[model].setdefault(target.name, []).append(turn)
            for target in targets:
                for model in MODELS:
                    if target.server is None:
                        results[model][target.name] = {"reason": target.reason}
                    else:
                        results[model][target.name] = summarize(turns[model][target.name])
        finally:
            stop_targets(targets)
    comparisons = paired_figures(results)
    print(describe(placement))
    print(format_table(results, args.concurrency, comparisons))
    if args.json:
        output = {"placement": describe(placement), "results": results, "paired": comparisons}
        args.json.write_text(json.dumps(output, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
