"""LAB ONLY: does the triton door scale past one CPU with more processes (issue 37, item 4)?

One door process holds the GIL for its Python work, so its threads cannot use a second CPU for
that work, and spread over two CPUs they hand the GIL across them. What several door processes
on one port would give (SO_REUSEPORT, the kernel spreading connections over the processes, each
serving its own copy of the models) is measured here without building it: `--processes` doors,
each on its own port, the client's concurrency split evenly over them, their throughputs
added, beside one door and real Triton under the same load. Each door's gRPC threads are on a
CPU of their own (`--grpc-thread-cpu`, the one door's by default). Nothing is pinned (`--pin off`):
the servers may use every CPU, and the client shares them (its CPU time is reported). Rounds
go round the servers in turn, so outside load hits each alike.

    python -m benchmarks.door_processes --workload add_sub --concurrency 32 --processes 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
from collections.abc import Sequence
from pathlib import Path

from benchmarks.client import CellResult, run_cell
from benchmarks.workloads import build_workload
from tests.harness.bridge_server import BridgeServer
from tests.harness.oracle import TritonOracle, oracle_unavailable_reason

REPOSITORY = Path(__file__).resolve().parent / "repository"


async def _cell(urls: list[str], workload: object, concurrency: int, seconds: float) -> float:
    """Requests per second over `urls`, `concurrency` split evenly over them."""
    share = max(1, concurrency // len(urls))
    results: list[CellResult] = await asyncio.gather(
        *(run_cell(url, workload, share, 10**9, seconds) for url in urls)  # type: ignore[arg-type]
    )
    for result in results:
        if result.errors:
            raise RuntimeError(f"{result.errors} errors: {result.first_error}")
    return sum(len(r.latencies) / r.elapsed for r in results if r.elapsed > 0)


def _door(log: Path, *args: str) -> BridgeServer:
    return BridgeServer(REPOSITORY, *args, log_path=log, startup_timeout=120).start()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="add_sub")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=6.0, help="per cell per round")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    workload = build_workload(args.workload)
    servers: dict[str, list] = {"door ×1": [], f"door ×{args.processes}": []}
    if oracle_unavailable_reason() is None:
        servers["triton"] = []
    logs = Path("/tmp") / "door_processes"
    logs.mkdir(exist_ok=True)
    try:
        servers["door ×1"].append(_door(logs / "one.log"))
        cpus = sorted(os.sched_getaffinity(0), reverse=True)
        for i in range(args.processes):  # each its gRPC threads' own CPU (--grpc-thread-cpu)
            cpu = f"--grpc-thread-cpu={cpus[i % len(cpus)]}"
            servers[f"door ×{args.processes}"].append(_door(logs / f"many{i}.log", cpu))
        if "triton" in servers:
            servers["triton"].append(TritonOracle(REPOSITORY, log_path=logs / "triton.log").start())
        rates: dict[str, list[float]] = {name: [] for name in servers}
        for index in range(args.rounds):
            names = list(servers)
            names = names[index % len(names) :] + names[: index % len(names)]
            for name in names:
                urls = [s.grpc_url for s in servers[name]]
                rate = asyncio.run(_cell(urls, workload, args.concurrency, args.seconds))
                rates[name].append(rate)
                print(f"round {index} {name:10} {rate:8.0f} req/s", flush=True)
        print(f"\n| {args.workload} c={args.concurrency}, unpinned | req/s (median of rounds) |")
        print("|---|---:|")
        for name, values in rates.items():
            print(f"| {name} | {statistics.median(values):,.0f} |")
    finally:
        for group in servers.values():
            for server in group:
                server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
