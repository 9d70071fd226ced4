"""BLS and ensemble overhead: the same tiny model called directly, through BLS, and through
ensembles, on the bridge next to real Triton serving the same repository.

`direct` adds 1 to a [16] FP32 tensor. `bls_sync` / `bls_async` forward their input to `direct`
with `exec()` / `await async_exec()`; `ensemble_1` is an ensemble with `direct` as its only
step, `ensemble_3` chains it three times. One client sends requests one after the other
(concurrency 1) for `--seconds` per cell after a warm-up; the overhead column is the median
latency minus the median of calling `direct` on the same server.

    python -m benchmarks.composition                        # triton and bridge, 3 s per cell
    python -m benchmarks.composition --servers bridge --seconds 0.5
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from benchmarks.servers import make_targets, start_targets, stop_targets

TENSOR = 'input [ { name: "IN", data_type: TYPE_FP32, dims: [ 16 ] } ]\n' + (
    'output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 16 ] } ]\n'
)

DIRECT_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() + 1)]
            )
            for r in requests
        ]
"""

BLS_SYNC_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            reply = pb_utils.InferenceRequest(
                model_name="direct", inputs=request.inputs(), requested_output_names=["OUT"]
            ).exec()
            responses.append(reply)
        return responses
"""

BLS_ASYNC_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            reply = await pb_utils.InferenceRequest(
                model_name="direct", inputs=request.inputs(), requested_output_names=["OUT"]
            ).async_exec()
            responses.append(reply)
        return responses
"""


def _ensemble_config(name: str, steps: int) -> str:
    tensors = ["IN"] + [f"t{i}" for i in range(1, steps)] + ["OUT"]
    step_text = ",\n".join(
        f'    {{ model_name: "direct" model_version: -1 input_map {{ key: "IN" value: '
        f'"{tensors[i]}" }} output_map {{ key: "OUT" value: "{tensors[i + 1]}" }} }}'
        for i in range(steps)
    )
    return (
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 0\n{TENSOR}'
        f"ensemble_scheduling {{\n  step [\n{step_text}\n  ]\n}}\n"
    )


# model -> (expected OUT - IN, config, model.py or None)
MODELS: dict[str, tuple[int, str, str | None]] = {
    "direct": (1, f'name: "direct"\nbackend: "python"\nmax_batch_size: 0\n{TENSOR}', DIRECT_PY),
    "bls_sync": (
        1,
        f'name: "bls_sync"\nbackend: "python"\nmax_batch_size: 0\n{TENSOR}',
        BLS_SYNC_PY,
    ),
    "bls_async": (
        1,
        f'name: "bls_async"\nbackend: "python"\nmax_batch_size: 0\n{TENSOR}',
        BLS_ASYNC_PY,
    ),
    "ensemble_1": (1, _ensemble_config("ensemble_1", 1), None),
    "ensemble_3": (3, _ensemble_config("ensemble_3", 3), None),
}


def write_repository(root: Path) -> Path:
    for name, (_, config, model_py) in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
        if model_py is not None:
            (root / name / "1" / "model.py").write_text(model_py)
    return root


def measure(url: str, model: str, seconds: float, warmup: int = 20) -> dict:
    """Sequential requests for `seconds`: latencies in ms, checked against the expected sum."""
    client = grpcclient.InferenceServerClient(url)
    data = np.arange(16, dtype=np.float32)
    tensor = grpcclient.InferInput("IN", [16], "FP32")
    tensor.set_data_from_numpy(data)
    expected = data + MODELS[model][0]
    latencies: list[float] = []
    errors = 0
    for _ in range(warmup):
        client.infer(model, [tensor])
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        start = time.perf_counter()
        try:
            result = client.infer(model, [tensor], client_timeout=30)
        except Exception:
            errors += 1
            continue
        latencies.append((time.perf_counter() - start) * 1000)
        if not np.array_equal(result.as_numpy("OUT"), expected):
            errors += 1
    client.close()
    return _summary(latencies, errors)


def measure_in_process(repository: Path, seconds: float) -> dict[str, dict]:
    """The same cells without any server: `Model.infer` on the loaded repository, so the
    overhead column is BLS / ensemble cost alone, with no transport around it."""
    from model_repository_loader import pb_utils
    from model_repository_loader.inference import InferRequest
    from model_repository_loader.loader import load_repository

    repo = load_repository([repository])
    data = np.arange(16, dtype=np.float32)
    results = {}
    try:
        for model, (added, _, _) in MODELS.items():
            served = repo.models[model]
            latencies: list[float] = []
            errors = 0
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                request = InferRequest([pb_utils.Tensor("IN", data)])
                start = time.perf_counter()
                response = served.infer(request, timeout=30)
                latencies.append((time.perf_counter() - start) * 1000)
                out = response.output_tensors()[0].as_numpy() if not response.has_error() else None
                errors += out is None or not np.array_equal(out, data + added)
            results[model] = _summary(latencies, errors)
    finally:
        repo.close()
    return results


def _summary(latencies: list[float], errors: int) -> dict:
    latencies.sort()
    return {
        "requests": len(latencies),
        "errors": errors,
        "p50_ms": statistics.median(latencies) if latencies else None,
        "mean_ms": statistics.fmean(latencies) if latencies else None,
        "p90_ms": latencies[int(len(latencies) * 0.9)] if latencies else None,
    }


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def format_table(results: dict[str, dict[str, dict]], servers: list[str]) -> str:
    lines = [
        "| model | server | requests | p50 ms | mean ms | p90 ms | overhead vs direct (p50) ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for model in MODELS:
        for server in servers:
            cell = results.get(model, {}).get(server)
            if cell is None:
                continue
            base = results["direct"].get(server, {}).get("p50_ms")
            overhead = None if base is None or cell["p50_ms"] is None else cell["p50_ms"] - base
            lines.append(
                f"| {model} | {server} | {cell['requests']} | {_ms(cell['p50_ms'])} | "
                f"{_ms(cell['mean_ms'])} | {_ms(cell['p90_ms'])} | "
                f"{'—' if model == 'direct' else _ms(overhead)} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--servers",
        default="triton,bridge,in-process",
        help="triton, bridge, echo (no BLS: not useful here) and in-process (no server)",
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="per cell")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    servers = [s for s in args.servers.split(",") if s]

    with tempfile.TemporaryDirectory(prefix="composition-bench-") as tmp:
        repository = write_repository(Path(tmp) / "repository")
        targets = make_targets([s for s in servers if s != "in-process"], Path(tmp) / "logs")
        results: dict[str, dict[str, dict]] = {model: {} for model in MODELS}
        try:
            start_targets(targets, repository, list(MODELS))
            for target in targets:
                if target.server is None:
                    print(f"{target.name}: unavailable ({target.reason})")
                    continue
                # Interleave models per server so drift hits every model alike.
                for model in MODELS:
                    results[model][target.name] = measure(target.url, model, args.seconds)
        finally:
            stop_targets(targets)
        if "in-process" in servers:
            for model, cell in measure_in_process(repository, args.seconds).items():
                results[model]["in-process"] = cell
    served = [s for s in servers if any(s in r for r in results.values())]
    print(format_table(results, served))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
