"""The triton door's CPU per request, per thread (issue 37's `/proc` method), for door variants
side by side.

One door per `--variants` entry, `name` or `name:VAR=VALUE[;VAR=VALUE…]` (the variables are set
in that door's environment: an experiment behind a switch, a tuning knob), the servers on the
placement's server CPUs and this client on its own (`--pin auto`, benchmarks/placement.py).
Each round gives each door, in a rotating order, one closed-loop cell (benchmarks/client.py)
and reads the door's `/proc/<pid>/task/*/stat` (utime + stime) before and after: CPU per
request, split by thread (`loop`: the process's main
thread, which runs the event loop; the others by their names: `python` are the loader's and the
pool's threads, `event_engine` gRPC core's). The warm-up's requests are counted in (3 waves).
It prints each round and the medians.

    python -m benchmarks.door_cpu --workload add_sub --concurrency 32
    python -m benchmarks.door_cpu --variants door,plain_malloc:MALLOC_ARENA_MAX=1

Two checkouts side by side (an A/B of a change): run it from outside both, so that each door's
PYTHONPATH, not the current folder, says where `bridge` comes from:

    cd /tmp && PYTHONPATH=$NEW python -m benchmarks.door_cpu --log-dir /tmp/door_cpu \
        --variants "old:PYTHONPATH=$OLD,new:PYTHONPATH=$NEW"
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
from collections.abc import Sequence
from pathlib import Path

from benchmarks.client import run_cell
from benchmarks.placement import choose
from benchmarks.workloads import build_workload
from tests.harness.bridge_server import BridgeServer

REPOSITORY = Path(__file__).resolve().parent / "repository"
WARMUP_WAVES = 3
_TICK_US = 1e6 / os.sysconf("SC_CLK_TCK")


def _threads(pid: int) -> dict[str, tuple[str, int]]:
    """{tid: (name, CPU ticks)} of every thread of `pid`."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except OSError:  # ended meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()
        out[tid] = (name, int(fields[11]) + int(fields[12]))
    return out


def _by_thread(before: dict, after: dict, pid: int) -> dict[str, float]:
    """CPU µs per thread name between two `_threads` readings (the main thread: `loop`)."""
    spent: dict[str, float] = {}
    for tid, (name, ticks) in after.items():
        key = "loop" if tid == str(pid) else name
        spent[key] = spent.get(key, 0.0) + (ticks - before.get(tid, (name, 0))[1]) * _TICK_US
    return spent


def _variant(entry: str) -> tuple[str, dict[str, str]]:
    """`name` or `name:VAR=VALUE;VAR=VALUE` → (name, its environment additions)."""
    name, _, assignments = entry.partition(":")
    env = dict(a.split("=", 1) for a in assignments.split(";") if "=" in a)
    return name, env


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.door_cpu")
    parser.add_argument("--variants", default="door")
    parser.add_argument("--workload", default="add_sub")
    parser.add_argument("--model", default="", help="the workload's model (default: its own)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=3000, help="per door and round")
    parser.add_argument("--seconds", type=float, default=10.0, help="at most, per cell")
    parser.add_argument("--pin", default="auto", choices=("auto", "off"))
    parser.add_argument("--log-dir", type=Path, default=Path("benchmarks/results/door_cpu"))
    args = parser.parse_args(argv)
    variants = dict(_variant(entry) for entry in args.variants.split(",") if entry)
    paths = list(variants)
    workload = build_workload(args.workload)
    model = args.model or workload.model
    placement = choose(args.pin)
    if placement is not None:
        placement.pin_server_side()
    args.log_dir.mkdir(parents=True, exist_ok=True)
    doors: dict[str, BridgeServer] = {}
    try:
        for path in paths:
            door = BridgeServer(
                REPOSITORY,
                "--frontend",
                "triton",
                log_path=args.log_dir / f"{path}.log",
                env=variants[path],
            )
            doors[path] = door
            door.start()
            door.wait_model_ready(model, timeout=120)
        if placement is not None:
            placement.pin_client()
        rounds: dict[str, list[tuple[float, float, float]]] = {path: [] for path in paths}
        for turn in range(args.rounds):
            for path in paths[turn % len(paths) :] + paths[: turn % len(paths)]:
                door = doors[path]
                assert door.process is not None
                pid = door.process.pid
                before = _threads(pid)
                cell = asyncio.run(
                    run_cell(door.grpc_url, workload, args.concurrency, args.requests, args.seconds)
                )
                spent = _by_thread(before, _threads(pid), pid)
                requests = len(cell.latencies) + cell.drained + WARMUP_WAVES * args.concurrency
                per_request = sum(spent.values()) / requests
                rps = len(cell.latencies) / cell.elapsed if cell.elapsed else 0.0
                p50 = statistics.median(cell.latencies) * 1000 if cell.latencies else 0.0
                rounds[path].append((per_request, rps, p50))
                top = sorted(spent.items(), key=lambda kv: -kv[1])[:4]
                print(
                    f"round {turn} {path:6s} {per_request:6.0f} µs/request  {rps:7.0f} req/s  "
                    f"p50 {p50:.3f} ms  "
                    f"errors {cell.errors}  "
                    + " ".join(f"{name}={cpu / requests:.0f}" for name, cpu in top),
                    flush=True,
                )
    finally:
        for door in doors.values():
            door.stop()
    print("median over rounds:")
    for path in paths:
        cpu = statistics.median(r[0] for r in rounds[path])
        rps = statistics.median(r[1] for r in rounds[path])
        p50 = statistics.median(r[2] for r in rounds[path])
        print(f"  {path:6s} {cpu:6.0f} µs/request  {rps:7.0f} req/s  p50 {p50:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
