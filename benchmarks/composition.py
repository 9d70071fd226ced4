"""BLS and ensemble overhead: the same tiny model called directly, through BLS, and through
ensembles, on the bridge next to real Triton serving the same repository.

`direct` adds 1 to a [16] FP32 tensor. `bls_sync` / `bls_async` forward their input to `direct`
with `exec()` / `await async_exec()`; `ensemble_1` is an ensemble with `direct` as its only
step, `ensemble_3` chains it three times. One client sends requests one after the other
(concurrency 1), `--seconds` per cell in all, split into `--rounds` turns: each round goes over
every server and, on each, over every model, so outside load hits each alike. The overhead of a
model is paired per round: its median latency minus the median of calling `direct` on the same
server in the same round, reported as the median and range over rounds.

    python -m benchmarks.composition                        # triton, bridge, in-process
    python -m benchmarks.composition --servers bridge --seconds 0.5 --rounds 2
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

from benchmarks.placement import PIN_CHOICES, choose, describe
from benchmarks.servers import make_targets, start_targets, stop_targets
from benchmarks.spread import format_spread, paired, spread

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


# One turn: the latencies (ms) of its checked answers, and how many answers were wrong or failed.
Turn = tuple[list[float], int]


class Remote:
    """Sequential requests to one server, every answer checked against the expected sum."""

    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.data = np.arange(16, dtype=np.float32)
        self.tensor = grpcclient.InferInput("IN", [16], "FP32")
        self.tensor.set_data_from_numpy(self.data)

    def turn(self, model: str, seconds: float, warmup: int = 20) -> Turn:
        expected = self.data + MODELS[model][0]
        latencies: list[float] = []
        errors = 0
        for _ in range(warmup):
            self.client.infer(model, [self.tensor])
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            start = time.perf_counter()
            try:
                result = self.client.infer(model, [self.tensor], client_timeout=30)
            except Exception:
                errors += 1
                continue
            latencies.append((time.perf_counter() - start) * 1000)
            if not np.array_equal(result.as_numpy("OUT"), expected):
                errors += 1
        return latencies, errors

    def close(self) -> None:
        self.client.close()


class InProcess:
    """The same cells without any server: `Model.infer` on the loaded repository, so the
    overhead is BLS / ensemble cost alone, with no transport around it."""

    def __init__(self, repository: Path) -> None:
        from model_repository_loader.loader import load_repository

        self.repo = load_repository([repository])
        self.data = np.arange(16, dtype=np.float32)

    def turn(self, model: str, seconds: float, warmup: int = 20) -> Turn:
        from model_repository_loader import pb_utils
        from model_repository_loader.inference import InferRequest

        served, added = self.repo.models[model], MODELS[model][0]
        latencies: list[float] = []
        errors = 0
        for _ in range(warmup):
            served.infer(InferRequest([pb_utils.Tensor("IN", self.data)]), timeout=30)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            request = InferRequest([pb_utils.Tensor("IN", self.data)])
            start = time.perf_counter()
            response = served.infer(request, timeout=30)
            latencies.append((time.perf_counter() - start) * 1000)
            out = response.output_tensors()[0].as_numpy() if not response.has_error() else None
            errors += out is None or not np.array_equal(out, self.data + added)
        return latencies, errors

    def close(self) -> None:
        self.repo.close()


def _summary(turns: list[Turn]) -> dict:
    latencies = sorted(lat for turn, _ in turns for lat in turn)
    return {
        "requests": len(latencies),
        "errors": sum(errors for _, errors in turns),
        "p50_ms": statistics.median(latencies) if latencies else None,
        "mean_ms": statistics.fmean(latencies) if latencies else None,
        "p90_ms": latencies[int(len(latencies) * 0.9)] if latencies else None,
        "turn_p50_ms": [statistics.median(turn) if turn else None for turn, _ in turns],
    }


def overheads(results: dict[str, dict[str, dict]]) -> None:
    """Add to every cell but `direct`'s its overhead: the per-round difference of p50s against
    `direct` on the same server, as median and range over rounds."""
    for model, by_server in results.items():
        if model == "direct":
            continue
        for server, cell in by_server.items():
            base = results["direct"].get(server)
            if base is not None:
                rounds = paired(cell["turn_p50_ms"], base["turn_p50_ms"], "difference")
                cell["overhead_ms"] = spread(rounds)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def format_table(results: dict[str, dict[str, dict]], servers: list[str]) -> str:
    lines = [
        "| model | server | requests | p50 ms | mean ms | p90 ms "
        "| overhead vs direct (p50), median [range] of rounds, ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for model in MODELS:
        for server in servers:
            cell = results.get(model, {}).get(server)
            if cell is None:
                continue
            overhead = "—" if model == "direct" else format_spread(cell.get("overhead_ms"), 3)
            lines.append(
                f"| {model} | {server} | {cell['requests']} | {_ms(cell['p50_ms'])} | "
                f"{_ms(cell['mean_ms'])} | {_ms(cell['p90_ms'])} | {overhead} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--servers",
        default="triton,bridge,in-process",
        help="triton, bridge and in-process (no server: the client's own process)",
    )
    parser.add_argument("--seconds", type=float, default=6.0, help="per cell, over all rounds")
    parser.add_argument("--rounds", type=int, default=4, help="turns per cell (default 4)")
    parser.add_argument("--pin", choices=PIN_CHOICES, default="auto")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    servers = [s for s in args.servers.split(",") if s]
    if not servers or set(servers) - {"triton", "bridge", "in-process"}:
        parser.error(f"servers: triton, bridge and/or in-process (got {args.servers})")
    if args.rounds < 1 or args.seconds <= 0:
        parser.error("--rounds and --seconds must be positive")

    placement = choose(args.pin)
    seconds = args.seconds / args.rounds
    runs: dict[str, dict[str, list[Turn]]] = {model: {} for model in MODELS}
    with tempfile.TemporaryDirectory(prefix="composition-bench-") as tmp:
        repository = write_repository(Path(tmp) / "repository")
        targets = make_targets([s for s in servers if s != "in-process"], Path(tmp) / "logs")
        sides: dict[str, Remote | InProcess] = {}
        try:
            start_targets(targets, repository, list(MODELS), placement)
            for target in targets:
                if target.server is None:
                    print(f"{target.name}: unavailable ({target.reason})")
                else:
                    sides[target.name] = Remote(target.url)
            if "in-process" in servers:
                sides["in-process"] = InProcess(repository)
            names, models = list(sides), list(MODELS)
            for round_index in range(args.rounds):
                # Who goes first rotates, for the servers and for the models on each.
                shift = round_index % len(names) if names else 0
                for name in names[shift:] + names[:shift]:
                    first = round_index % len(models)
                    for model in models[first:] + models[:first]:
                        runs[model].setdefault(name, []).append(sides[name].turn(model, seconds))
        finally:
            for side in sides.values():
                side.close()
            stop_targets(targets)
    results = {
        model: {name: _summary(turns) for name, turns in runs[model].items()} for model in MODELS
    }
    overheads(results)
    served = [s for s in servers if any(s in r for r in results.values())]
    print(describe(placement))
    print(format_table(results, served))
    if args.json is not None:
        output = {"placement": describe(placement), "results": results}
        args.json.write_text(json.dumps(output, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
