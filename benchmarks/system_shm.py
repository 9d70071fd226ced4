"""FP32 × 1M through the client's system shared memory: the door ÷ Triton's own shared-memory
path (issue 27 item 4), with the same tensor sent in the request beside it.

`shm`: the client registers an input and an output region on each server (objects it creates
under /dev/shm, owned by its uid like the server's), and each request names them: the input is
read from the region, `identity_fp32`'s output is written into the other. On the embedded door
the input reaches `execute` as a view of the region and the output is written into it straight
from the model's array (bridge/frontends/triton/shm.py); Triton copies the input into its
python backend's memory and the output out of it. `raw`: the same tensor in
`raw_input_contents`, its output in the answer. Each cell gets `--seconds` in all, split into
`--rounds` turns that go round the cells in a rotating order; door ÷ Triton is paired per round
(p50) and reported as median [range]. Every turn ends with a check of the output region.

    python -m benchmarks.system_shm                     # triton and door, c=1, 8 s per cell
    python -m benchmarks.system_shm --seconds 2 --rounds 2 --workloads shm
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from benchmarks.closed_loop import LoadResult, closed_loop, pooled
from benchmarks.placement import PIN_CHOICES, choose, describe
from benchmarks.servers import Target, make_targets, start_targets, stop_targets
from benchmarks.spread import comparison_lines, paired, spread

REPOSITORY = Path(__file__).resolve().parent / "repository"
MODEL = "identity_fp32"
COUNT = 1_000_000
SIZE = 4 * COUNT
WORKLOADS = ("shm", "raw")
SERVERS = ("triton", "door")
SHM = Path("/dev/shm")


class Regions:
    """The input and output objects of one server, registered on it."""

    def __init__(self, target: Target, data: np.ndarray) -> None:
        self.url = target.url
        tag = f"bench_shm_{target.name}_{os.getpid()}"
        self.input_path, self.output_path = SHM / f"{tag}_in", SHM / f"{tag}_out"
        self.input_path.write_bytes(data.tobytes())
        self.output_path.write_bytes(bytes(SIZE))
        with grpcclient.InferenceServerClient(self.url) as client:
            client.register_system_shared_memory("in", "/" + self.input_path.name, SIZE)
            client.register_system_shared_memory("out", "/" + self.output_path.name, SIZE)

    def output(self) -> bytes:
        return self.output_path.read_bytes()

    def close(self) -> None:
        try:
            with grpcclient.InferenceServerClient(self.url) as client:
                client.unregister_system_shared_memory()
        finally:
            self.input_path.unlink(missing_ok=True)
            self.output_path.unlink(missing_ok=True)


def measure(
    workload: str, url: str, data: np.ndarray, seconds: float, regions: Regions
) -> LoadResult:
    """One turn at c=1; the output region (or one answer) is checked at its end."""

    def inputs() -> list[grpcclient.InferInput]:
        tensor = grpcclient.InferInput("INPUT0", [COUNT], "FP32")
        if workload == "shm":
            tensor.set_shared_memory("in", SIZE)
        else:
            tensor.set_data_from_numpy(data)
        return [tensor]

    output = grpcclient.InferRequestedOutput("OUTPUT0")
    keep: Callable[[grpcclient.InferResult], Any] | None = None
    if workload == "shm":
        output.set_shared_memory("out", SIZE)
    else:
        keep = lambda result: bool(np.array_equal(result.as_numpy("OUTPUT0"), data))  # noqa: E731
    if workload == "shm":
        regions.output_path.write_bytes(bytes(SIZE))  # so the check below sees this turn's writes
    turn = closed_loop(
        url, MODEL, inputs, 1, seconds, keep=keep, warmup=min(1.0, seconds / 2), outputs=[output]
    )
    if workload == "shm" and regions.output() != data.tobytes():
        turn.failures.append("the output region does not hold the input")
    if keep is not None and not all(turn.results):
        turn.failures.append("an answer differs from the input")
    return turn


def format_table(results: dict[str, dict[str, dict]], comparisons: dict[str, dict]) -> str:
    lines = [
        "| workload (FP32 × 1M, c=1) | server | p50 ms | p99 ms | req/s | errors |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for workload, by_server in results.items():
        for server, r in by_server.items():
            if r.get("throughput") is None:
                lines.append(f"| {workload} | {server} | n/a | | | {r.get('reason', r)} |")
                continue
            lines.append(
                f"| {workload} | {server} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                f"{r['throughput']:.0f} | {r['errors']} |"
            )
    lines += comparison_lines("p50", comparisons)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--seconds", type=float, default=8.0, help="per cell, over all rounds")
    parser.add_argument("--rounds", type=int, default=8, help="turns per cell (default 8)")
    parser.add_argument("--pin", choices=PIN_CHOICES, default="auto")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    names = [n for n in args.servers.split(",") if n]
    workloads = [w for w in args.workloads.split(",") if w]
    if not names or set(names) - set(SERVERS):
        parser.error(f"servers: triton and/or door (got {args.servers})")
    if not workloads or set(workloads) - set(WORKLOADS):
        parser.error(f"workloads: shm and/or raw (got {args.workloads})")
    if args.rounds < 1 or args.seconds <= 0:
        parser.error("--rounds and --seconds must be positive")

    data = np.random.default_rng(COUNT).standard_normal(COUNT).astype(np.float32)
    placement = choose(args.pin)
    turns: dict[str, dict[str, list[LoadResult]]] = {w: {} for w in workloads}
    results: dict[str, dict[str, dict]] = {w: {} for w in workloads}
    regions: dict[str, Regions] = {}
    # The door's servers take clients' regions only when told (--allow-client-shm, as Triton
    # 2.70 on); its flags' environment form reaches every bridge server started here.
    os.environ.setdefault("DYN_BRIDGE_ALLOW_CLIENT_SHM", "true")
    with tempfile.TemporaryDirectory(prefix="bench-system-shm-") as tmp:
        targets = make_targets(names, Path(tmp) / "logs")
        try:
            start_targets(targets, REPOSITORY, [MODEL], placement)
            live = [t for t in targets if t.server is not None]
            for target in live:
                regions[target.name] = Regions(target, data)
            cells = [(w, t) for w in workloads for t in live]
            for round_index in range(args.rounds):
                shift = round_index % max(len(cells), 1)  # who goes first rotates
                for workload, target in cells[shift:] + cells[:shift]:
                    turn = measure(
                        workload,
                        target.url,
                        data,
                        args.seconds / args.rounds,
                        regions[target.name],
                    )
                    turns[workload].setdefault(target.name, []).append(turn)
            for target in targets:
                for workload in workloads:
                    if target.server is None:
                        results[workload][target.name] = {"reason": target.reason}
                        continue
                    summary = pooled(turns[workload][target.name]).summary()
                    summary["turn_p50_ms"] = [
                        t.summary().get("p50_ms") for t in turns[workload][target.name]
                    ]
                    results[workload][target.name] = summary
        finally:
            for each in regions.values():
                each.close()
            stop_targets(targets)
    comparisons = {}
    for workload, by_server in results.items():
        door, triton = by_server.get("door"), by_server.get("triton")
        if door and triton and door.get("turn_p50_ms") and triton.get("turn_p50_ms"):
            rounds = paired(door["turn_p50_ms"], triton["turn_p50_ms"])
            comparisons[f"{workload}: door ÷ triton"] = spread(rounds)
    print(describe(placement))
    print(format_table(results, comparisons))
    if args.json:
        output = {"placement": describe(placement), "results": results, "paired": comparisons}
        args.json.write_text(json.dumps(output, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
