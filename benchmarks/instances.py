"""Instance kinds: a CPU-bound pure-Python model with 1, 2 and 4 instances, as threads in the
bridge's process and as one process each, on the bridge next to real Triton (which always runs a
process per instance).

The model spends `--work-ms` of pure-Python work per request holding the GIL, as a tokenizer or
a hand-written pre-processing loop does. Threads cannot run that in parallel; processes can.

Each cell (model × server) gets `--seconds` in all, split into `--rounds` turns that go round
the cells in turn, so outside load hits each alike. Comparisons are paired per round (processes
÷ threads on the bridge, bridge processes ÷ Triton, per instance count) and reported as the
median and range over rounds.

    python -m benchmarks.instances                     # triton and bridge, c=8, 8 s per cell
    python -m benchmarks.instances --servers bridge --seconds 1 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from benchmarks.closed_loop import LoadResult, closed_loop, pooled
from benchmarks.placement import PIN_CHOICES, choose, describe
from benchmarks.servers import make_targets, start_targets, stop_targets
from benchmarks.spread import comparison_lines, paired, spread

MODEL_PY = """
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            work_ms = json.loads(request.parameters()).get("work_ms", 5)
            end = time.perf_counter() + work_ms / 1000
            n = 0
            while time.perf_counter() < end:  # pure Python: holds the GIL
                n += 1
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1)]))
        return responses
"""

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X", data_type: TYPE_FP32, dims: [ 4 ] }} ]
output [ {{ name: "Y", data_type: TYPE_FP32, dims: [ 4 ] }} ]
instance_group [ {{ count: {count}, kind: KIND_CPU }} ]
parameters {{ key: "BRIDGE_INSTANCE_KIND" value {{ string_value: "{kind}" }} }}
"""

COUNTS = (1, 2, 4)
KINDS = ("thread", "process")


def model_name(kind: str, count: int) -> str:
    return f"cpu_{kind}_{count}"


def write_repository(root: Path) -> Path:
    for kind in KINDS:
        for count in COUNTS:
            name = model_name(kind, count)
            (root / name / "1").mkdir(parents=True)
            config = CONFIG.format(name=name, count=count, kind=kind)
            (root / name / "config.pbtxt").write_text(config)
            (root / name / "1" / "model.py").write_text(MODEL_PY)
    return root


def _inputs() -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("X", [4], "FP32")
    tensor.set_data_from_numpy(np.ones(4, np.float32))
    return [tensor]


def paired_figures(results: dict[str, dict[str, dict]]) -> dict[str, dict]:
    """Per-round throughput ratios per instance count: the bridge's processes over its threads,
    and the bridge's processes over Triton's (which are processes too)."""
    out: dict[str, dict] = {}

    def turns(model: str, server: str) -> list:
        return (results[model].get(server) or {}).get("turn_throughput") or []

    for count in COUNTS:
        process, thread = model_name("process", count), model_name("thread", count)
        pairs = {
            f"{count} instances: bridge processes ÷ threads": (
                turns(process, "bridge"),
                turns(thread, "bridge"),
            ),
            f"{count} instances: bridge processes ÷ triton": (
                turns(process, "bridge"),
                turns(process, "triton"),
            ),
        }
        for name, (a, b) in pairs.items():
            if a and b:
                out[name] = spread(paired(a, b))
    return out


def format_table(
    results: dict[str, dict[str, dict]],
    concurrency: int,
    work_ms: float,
    comparisons: dict[str, dict],
) -> str:
    lines = [
        f"CPU-bound model, {work_ms:g} ms of pure Python per request, c={concurrency}, "
        f"{os.cpu_count()} CPUs",
        "",
        "| instances | bridge threads req/s | bridge processes req/s | Triton req/s "
        "| bridge p50 ms (threads / processes) | errors |",
        "|---:|---:|---:|---:|---|---:|",
    ]
    for count in COUNTS:
        thread = results[model_name("thread", count)]
        process = results[model_name("process", count)]
        triton = process.get("triton", {})
        errors = sum(r.get("errors", 0) for m in (thread, process) for r in m.values())

        def rate(r: dict) -> str:
            return f"{r['throughput']:.0f}" if r.get("throughput") else "n/a"

        def p50(r: dict) -> str:
            return f"{r['p50_ms']:.1f}" if r.get("throughput") else "n/a"

        bt, bp = thread.get("bridge", {}), process.get("bridge", {})
        lines.append(
            f"| {count} | {rate(bt)} | {rate(bp)} | {rate(triton)} | {p50(bt)} / {p50(bp)} "
            f"| {errors} |"
        )
    lines += comparison_lines("throughput", comparisons)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="triton,bridge")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0, help="per cell, over all rounds")
    parser.add_argument("--rounds", type=int, default=4, help="turns per cell (default 4)")
    parser.add_argument("--work-ms", type=float, default=5.0)
    parser.add_argument("--pin", choices=PIN_CHOICES, default="auto")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    names = [n for n in args.servers.split(",") if n]
    if not names or set(names) - {"triton", "bridge"}:
        parser.error(f"servers: triton and/or bridge (got {args.servers})")
    if args.rounds < 1 or args.seconds <= 0:
        parser.error("--rounds and --seconds must be positive")

    placement = choose(args.pin)
    models = [model_name(kind, count) for kind in KINDS for count in COUNTS]
    turns: dict[str, dict[str, list[LoadResult]]] = {model: {} for model in models}
    results: dict[str, dict[str, dict]] = {model: {} for model in models}
    with tempfile.TemporaryDirectory(prefix="bench-instances-") as tmp:
        repository = write_repository(Path(tmp) / "repository")
        targets = make_targets(names, Path(tmp) / "logs")
        try:
            start_targets(targets, repository, models, placement)
            # Triton has only processes: its row is the process one.
            cells = [
                (model, target)
                for model in models
                for target in targets
                if target.server is not None
                and not (target.name == "triton" and "_thread_" in model)
            ]
            for round_index in range(args.rounds):
                shift = round_index % max(len(cells), 1)  # who goes first rotates
                for model, target in cells[shift:] + cells[:shift]:
                    turn = closed_loop(
                        target.url,
                        model,
                        _inputs,
                        args.concurrency,
                        args.seconds / args.rounds,
                        warmup=min(1.0, args.seconds / args.rounds / 2),
                        parameters={"work_ms": args.work_ms},
                    )
                    turns[model].setdefault(target.name, []).append(turn)
            for model in models:
                for target in targets:
                    if target.server is None:
                        results[model][target.name] = {"reason": target.reason}
                    elif target.name in turns[model]:
                        runs = turns[model][target.name]
                        summary = pooled(runs).summary()
                        summary["turn_throughput"] = [t.summary()["throughput"] for t in runs]
                        results[model][target.name] = summary
        finally:
            stop_targets(targets)
    comparisons = paired_figures(results)
    print(describe(placement))
    print(format_table(results, args.concurrency, args.work_ms, comparisons))
    if args.json:
        output = {"placement": describe(placement), "results": results, "paired": comparisons}
        args.json.write_text(json.dumps(output, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
