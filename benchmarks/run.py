"""Benchmark the bridge side by side with real Triton, a second bridge and a bare Dynamo echo.

    python -m benchmarks.run                      # everything, default bounds
    python -m benchmarks.run --workloads fp32_4,fp32_1k --concurrency 1 --servers bridge,echo
    python -m benchmarks.run --mode open --rates 100,400 --workloads fp32_4
    python -m benchmarks.run --preset door        # issue 13's table: the triton door vs Triton

All servers run at once on this machine, each on its own loopback ports, serving a copy of the
benchmark models (benchmarks/repository); the client runs on a CPU of its own where there are
two or more (benchmarks/placement.py). For every cell (workload × concurrency, or workload ×
arrival rate in open loop) the servers take turns, round after round, with the same client
load. Every ratio is reported with its spread over rounds, next to the A/A ratio of two
identical bridges. Output: a table per cell on the console, then results.json, results.md (the
table) and plot.png in --output-dir.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.metadata
import itertools
import math
import os
import platform
import shlex
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import report
from .client import CellResult, run_cell, run_open_cell
from .placement import PIN_CHOICES, choose, describe
from .servers import (
    DEFAULT_SERVERS,
    FLOORS,
    SERVER_NAMES,
    Target,
    make_targets,
    start_targets,
    stop_targets,
)
from .workloads import WORKLOAD_NAMES, Workload, build_workload

HERE = Path(__file__).resolve().parent
REPOSITORY = HERE / "repository"
DEFAULT_OUTPUT = HERE / "results"


def _names(known: Sequence[str]):  # an argparse type: "a,b" → ["a", "b"], each one known
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(unknown) or 'empty list'}; choose from {', '.join(known)}"
            )
        return names

    return parse


def _ints(text: str) -> list[int]:
    try:
        values = [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers like 1,8,32, got '{text}'")
    return values


def _rates(text: str) -> list[float]:
    try:
        values = [float(n) for n in text.split(",") if n.strip()]
    except ValueError:
        values = []
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive rates like 50,200, got '{text}'")
    return values


# A preset: the cells it measures, (workload, concurrency, servers), closed loop.
_TRITON_DOORS = ("triton", "door", "door_split")
# The c=1 rows also show Dynamo's own frontend (`bridge`) and the bare echo worker behind it, so
# the README's side-by-side table of the two doors comes from one run.
_EVERY_DOOR = ("triton", "bridge", "door", "door_split", "echo")
PRESETS: dict[str, tuple[tuple[str, int, tuple[str, ...]], ...]] = {
    # Issue 13's table (report.DOOR_TARGETS); the split door only has c=1 targets.
    "door": (
        ("fp32_4", 1, _EVERY_DOOR),
        ("fp32_100k", 1, _EVERY_DOOR),
        ("fp32_1m", 1, _EVERY_DOOR),
        ("add_sub", 32, ("triton", "door")),
        ("fp32_100k", 32, ("triton", "door")),
        ("stream_100_shared", 32, ("triton", "door")),
    ),
    # Issue 27 item 5: the door beside the lab's synchronous door (door_sync.py) and bare gRPC
    # servers (grpc_floor.py), each ÷ Triton.
    "floors": tuple(
        (workload, concurrency, ("triton", "door", "door_sync", *FLOORS))
        for workload, concurrency in (
            ("fp32_4", 1),
            ("fp32_100k", 1),
            ("fp32_1m", 1),
            ("add_sub", 32),
            ("fp32_100k", 32),
        )
    ),
}
# A preset's budget unless given: about 12 minutes for "door" on a 2-CPU machine.
PRESET_BUDGET = {"max_seconds": 26.0, "max_requests": 8000}
DEFAULT_BUDGET = {"max_seconds": 8.0, "max_requests": 2000}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description="Benchmark dynamo-bridge against real Triton and a bare Dynamo echo worker.",
    )
    p.add_argument(
        "--workloads",
        type=_names(WORKLOAD_NAMES),
        default=list(WORKLOAD_NAMES),
        help=f"comma-separated (default all: {','.join(WORKLOAD_NAMES)})",
    )
    p.add_argument(
        "--concurrency",
        type=_ints,
        default=[1, 8, 32],
        help="requests in flight, comma-separated (default 1,8,32)",
    )
    p.add_argument(
        "--servers",
        type=_names(SERVER_NAMES),
        default=list(DEFAULT_SERVERS),
        help=f"comma-separated (default {','.join(DEFAULT_SERVERS)}; bridge2 is a second "
        "bridge, the A/A noise floor; door is --frontend triton, door_split the same door as "
        "--role frontend with one --role worker over tcp); triton needs the oracle env "
        "(DYNAMO_BRIDGE_ORACLE_PYTHON) and is n/a without it",
    )
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="door: exactly issue 13's table (the triton door embedded and split against "
        "Triton, six cells); floors: the door beside the lab's synchronous door "
        "(door_sync.py) and the bare gRPC servers of grpc_floor.py, each against Triton "
        "(--workloads, --concurrency, --servers and --mode are ignored; "
        f"budget {PRESET_BUDGET['max_seconds']:g} s per server per cell unless given)",
    )
    p.add_argument(
        "--mode",
        choices=("closed", "open", "both"),
        default="closed",
        help="closed loop at each --concurrency, open loop at each --rates, or both "
        "(default closed)",
    )
    p.add_argument(
        "--rates",
        type=_rates,
        default=[100.0, 300.0],
        help="open loop: requests per second, comma-separated (default 100,300)",
    )
    p.add_argument(
        "--max-requests",
        type=int,
        default=None,
        help="per server per cell, over all rounds (default 2000: a p99 of 20 requests)",
    )
    p.add_argument(
        "--max-seconds", type=float, default=None, help="per server per cell (default 8)"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=8,
        help="split each cell's budget into this many turns per server, interleaved, so a "
        "burst of load from elsewhere hits every server alike; ratios are reported as the "
        "median and range of the per-round ratios (default 8)",
    )
    p.add_argument(
        "--pin",
        choices=PIN_CHOICES,
        default="auto",
        help="auto: the client on the first CPU, the servers on the others, when there are two "
        "or more; off: no pinning (default auto)",
    )
    p.add_argument("--warmup", type=int, default=3, help="unmeasured requests per turn (default 3)")
    p.add_argument(
        "--request-timeout", type=float, default=30.0, help="per request, seconds (default 30)"
    )
    p.add_argument(
        "--output-dir",
        type=Path,
        default=DEFAULT_OUTPUT,
        help="where results.json, results.md, plot.png and the server logs go "
        "(default benchmarks/results/)",
    )
    p.add_argument("--no-plot", action="store_true", help="do not write plot.png")
    return p


def _copy_models(models: Sequence[str], destination: Path) -> Path:
    # Only the models the chosen workloads need: every server starts faster.
    for model in models:
        shutil.copytree(
            REPOSITORY / model, destination / model, ignore=shutil.ignore_patterns("__pycache__")
        )
    return destination


async def _measure_cell(
    targets: Sequence[Target],
    workload: Workload,
    load: tuple[str, float],
    args: argparse.Namespace,
) -> dict[str, CellResult]:
    """`load` is ("closed", concurrency) or ("open", requests per second)."""
    kind, amount = load
    live = [t for t in targets if t.server is not None]
    results = {t.name: CellResult() for t in live}
    requests = math.ceil(args.max_requests / args.rounds)
    seconds = args.max_seconds / args.rounds
    for _ in range(args.rounds):
        for target in live:
            if results[target.name].errors and not results[target.name].latencies:
                continue  # it could not run this workload at all; don't wait for it again
            run = run_cell if kind == "closed" else run_open_cell
            turn = await run(
                target.url,
                workload,
                int(amount) if kind == "closed" else amount,
                requests,
                seconds,
                warmup=args.warmup,
                request_timeout=args.request_timeout,
            )
            results[target.name].merge(turn)
    return results


Plan = list[tuple[Workload, tuple[str, float], tuple[str, ...]]]


def _plan(args: argparse.Namespace, workloads: Sequence[Workload], servers: Sequence[str]) -> Plan:
    """The cells to measure: (workload, load, servers), in order."""
    if args.preset:
        built = {w.name: w for w in workloads}
        return [(built[w], ("closed", c), names) for w, c, names in PRESETS[args.preset]]
    loads: list[tuple[str, float]] = []
    if args.mode in ("closed", "both"):
        loads += [("closed", c) for c in args.concurrency]
    if args.mode in ("open", "both"):
        loads += [("open", r) for r in args.rates]
    return [(w, load, tuple(servers)) for w, load in itertools.product(workloads, loads)]


async def _measure_all(
    targets: list[Target], plan: Plan, args: argparse.Namespace, servers: Sequence[str]
) -> list[dict[str, Any]]:
    cells = []
    for index, (workload, load, names) in enumerate(plan):
        chosen = [t for t in targets if t.name in names]
        # Rotate who goes first, so no server always runs right after the same other one.
        shift = index % len(chosen)
        order = chosen[shift:] + chosen[:shift]
        loadavg = os.getloadavg()[0]
        measured = await _measure_cell(order, workload, load, args)
        results = {
            t.name: (measured[t.name].summary() if t.name in measured else None) for t in targets
        }
        cell = {
            "workload": workload.name,
            "description": workload.description,
            "model": workload.model,
            "mode": load[0],
            "concurrency": int(load[1]) if load[0] == "closed" else None,
            "rate": load[1] if load[0] == "open" else None,
            "loadavg_1m_before": round(loadavg, 2),
            "results": results,
            "ratios": report.cell_ratios(results),
        }
        print(report.format_cell_line(cell, [s for s in servers if s in names]), flush=True)
        cells.append(cell)
    return cells


def _versions(targets: Sequence[Target]) -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in ("ai-dynamo-runtime", "tritonclient", "grpcio", "numpy"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    for target in targets:
        if target.name == "triton" and target.server is not None:
            try:
                versions["tritonserver"] = target.server.client().get_server_metadata().version
            except Exception:  # only informative
                pass
    return versions


def _machine() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu": cpu, "platform": platform.platform()}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    budget = PRESET_BUDGET if args.preset else DEFAULT_BUDGET
    for key, value in budget.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.preset:
        args.workloads = list(dict.fromkeys(w for w, _, _ in PRESETS[args.preset]))
        args.servers = list(dict.fromkeys(s for _, _, names in PRESETS[args.preset] for s in names))
        args.mode = "closed"
    if args.max_requests < 1 or args.max_seconds <= 0 or args.rounds < 1:
        print("error: --max-requests, --max-seconds and --rounds must be positive", file=sys.stderr)
        return 2
    workloads = [build_workload(name) for name in args.workloads]
    models = list(dict.fromkeys(w.model for w in workloads))
    servers = [s for s in SERVER_NAMES if s in args.servers]
    output = args.output_dir.absolute()
    output.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc)

    with tempfile.TemporaryDirectory(prefix="dynamo-bridge-bench-") as tmp:
        repository = _copy_models(models, Path(tmp) / "repository")
        placement = choose(args.pin)
        print(f"starting {', '.join(servers)} on {', '.join(models)} ...", flush=True)
        print(f"  {describe(placement)}", flush=True)
        targets = make_targets(servers, output / "logs")
        try:
            start_targets(targets, repository, models, placement)
            available = {
                t.name: {"available": t.server is not None, "reason": t.reason} for t in targets
            }
            for target in targets:
                state = target.url if target.server else f"{report.NA}: {target.reason}"
                print(f"  {target.name:<7} {state}", flush=True)
            if not any(t.server for t in targets):
                print("error: no server could be started", file=sys.stderr)
                return 1
            load_before = os.getloadavg()
            plan = _plan(args, workloads, servers)
            cells = asyncio.run(_measure_all(targets, plan, args, servers))
            load_after = os.getloadavg()
            versions = _versions(targets)
        finally:
            stop_targets(targets)

    table = report.format_table(cells, servers)
    if args.preset == "floors":
        table += "\n\nEach server ÷ Triton:\n\n" + report.format_against_triton(cells, servers)
    elif "door" in servers or "door_split" in servers:
        table += (
            "\n\nThe triton door ÷ Triton (issue 13's targets):\n\n"
            + report.format_door_table(cells)
        )
    results = {
        "date": started.isoformat(timespec="seconds"),
        "command": shlex.join(
            [Path(sys.executable).name, "-m", "benchmarks.run", *(argv or sys.argv[1:])]
        ),
        "client": "grpc.aio, one channel per server and turn, prebuilt raw ModelInferRequest, "
        "every response checked",
        "placement": describe(placement),
        "machine": _machine(),
        "versions": versions,
        "loadavg_before": [round(v, 2) for v in load_before],
        "loadavg_after": [round(v, 2) for v in load_after],
        "settings": {
            "preset": args.preset,
            "workloads": args.workloads,
            "mode": args.mode,
            "concurrency": args.concurrency,
            "rates": args.rates,
            "max_requests": args.max_requests,
            "max_seconds": args.max_seconds,
            "rounds": args.rounds,
            "warmup": args.warmup,
        },
        "servers": available,
        "cells": cells,
        "table": table,
    }
    print()
    print(table)
    report.write_json(output / "results.json", results)
    (output / "results.md").write_text(table + "\n")
    written = [output / "results.json", output / "results.md"]
    if not args.no_plot:
        problem = report.write_plot(output / "plot.png", cells, servers)
        if problem:
            print(f"plot skipped: {problem}")
        else:
            written.append(output / "plot.png")
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
