"""Closed-loop HTTP throughput and latency: real Triton's HTTP port against the triton door's.

A measurement, not a test. Both servers serve `benchmarks/repository` (the FP32 identity model),
started with the test harness: Triton from the oracle environment (DYNAMO_BRIDGE_ORACLE_PYTHON),
the door as `python -m bridge --frontend triton`. Each of `c` keep-alive connections sends one
prepared request (FP32 × n, the binary tensor extension both ways, as tritonclient.http sends
it) and reads the whole answer before sending the next. The client is asyncio over raw sockets
(uvloop): a few µs a request, so that at c=32 the servers and not the client set the rate, which
a Python tritonclient.http would not. Every answer's status is checked, and each cell's first
answer's bytes against the input.

The servers take turns within each round, so that a noisy moment of the machine lands on both;
they run on the placement's server CPUs and the client on its own (`--pin auto`,
benchmarks/placement.py). Bounded: `--seconds` per cell, rounds × cells of them, plus start-up.
It refuses to measure when the 1-minute load average is 3 or more (`--ignore-load` measures
anyway).

    python -m benchmarks.http_load [--sizes 4,100000] [--concurrency 1,32] [--rounds 4]

Prints a row per (size, c): each server's req/s and p50, and door ÷ Triton (median [range] of
the rounds' ratios: throughput at c > 1, p50 at c = 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import uvloop

from benchmarks.placement import PIN_CHOICES, choose, describe
from benchmarks.servers import make_targets, start_targets, stop_targets

REPOSITORY = Path(__file__).resolve().parent / "repository"
MODEL = "identity_fp32"
_HEAD_END = b"\r\n\r\n"


def request_bytes(size: int, port: int) -> tuple[bytes, bytes]:
    """(one whole request of FP32 × size to MODEL, the tensor's bytes the answer must carry)."""
    tensor = np.arange(size, dtype=np.float32).tobytes()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [size],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(tensor)},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    head = (
        f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{port}\r\n"
        "Content-Type: application/octet-stream\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\n"
        f"Content-Length: {len(header) + len(tensor)}\r\n\r\n"
    ).encode()
    return head + header + tensor, tensor


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """(status, body) of one HTTP/1.1 answer with a Content-Length."""
    head = await reader.readuntil(_HEAD_END)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = 0
    for line in lines[1:]:
        name, _, text = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(text)
    return status, await reader.readexactly(length)


@dataclass
class Cell:
    latencies: list[float] = field(default_factory=list)
    elapsed: float = 0.0

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed else 0.0

    @property
    def p50_ms(self) -> float:
        return 1000 * statistics.median(self.latencies) if self.latencies else float("nan")


async def run_cell(port: int, size: int, concurrency: int, seconds: float) -> Cell:
    """`concurrency` connections, closed loop, for `seconds` after one warm-up answer each."""
    request, tensor = request_bytes(size, port)
    connections = [await asyncio.open_connection("127.0.0.1", port) for _ in range(concurrency)]
    cell = Cell()
    try:
        for reader, writer in connections:  # warm-up, and the answer checked once
            writer.write(request)
            status, body = await _answer(reader)
            if status != 200 or not body.endswith(tensor):
                raise AssertionError(f"port {port}: {status} {body[:200]!r}")
        end = time.perf_counter() + seconds

        async def loop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while (start := time.perf_counter()) < end:
                writer.write(request)
                status, _ = await _answer(reader)
                if status != 200:
                    raise AssertionError(f"port {port}: status {status}")
                cell.latencies.append(time.perf_counter() - start)

        began = time.perf_counter()
        await asyncio.gather(*(loop(r, w) for r, w in connections))
        cell.elapsed = time.perf_counter() - began
    finally:
        for _, writer in connections:
            writer.close()
    return cell


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,100000")
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--seconds", type=float, default=4.0, help="per cell and server")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--pin", choices=PIN_CHOICES, default="auto")
    parser.add_argument(
        "--ignore-load", action="store_true", help="measure on a busy machine too (noisy)"
    )
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    if load >= 3 and not args.ignore_load:
        print(f"load average {load:.1f} >= 3: not measuring", file=sys.stderr)
        return 2
    sizes = [int(s) for s in args.sizes.split(",")]
    levels = [int(c) for c in args.concurrency.split(",")]
    placement = choose(args.pin)
    with tempfile.TemporaryDirectory() as tmp:
        targets = make_targets(("triton", "door"), Path(tmp))
        try:
            start_targets(targets, REPOSITORY, [MODEL], placement)
            missing = [f"{t.name}: {t.reason}" for t in targets if t.server is None]
            if missing:
                print("cannot measure: " + "; ".join(missing), file=sys.stderr)
                return 2
            print(f"{describe(placement)}; load average {load:.1f} at start", flush=True)
            servers = {t.name: t.server for t in targets}
            rows = _measure(servers, sizes, levels, args)
        finally:
            stop_targets(targets)
    print(
        f"\nHTTP, FP32 identity, binary tensors both ways, closed loop ({args.rounds} rounds of "
        f"{args.seconds:g} s per server and cell)"
    )
    print(
        "| FP32 × n | c | Triton req/s | door req/s | Triton p50 ms | door p50 ms | door ÷ Triton |"
    )
    print("|---|---|---:|---:|---:|---:|---|")
    for (size, level), row in rows.items():
        ratios = row["ratios"]
        triton, door = row["triton"], row["door"]
        print(
            f"| {size} | {level} | {statistics.median(c.rate for c in triton):,.0f} | "
            f"{statistics.median(c.rate for c in door):,.0f} | "
            f"{statistics.median(c.p50_ms for c in triton):.2f} | "
            f"{statistics.median(c.p50_ms for c in door):.2f} | "
            f"{statistics.median(ratios):.2f} [{min(ratios):.2f}–{max(ratios):.2f}] "
            f"({'p50' if level == 1 else 'req/s'}) |"
        )
    return 0


def _measure(
    servers: dict[str, Any],
    sizes: list[int],
    levels: list[int],
    args: argparse.Namespace,
) -> dict[tuple[int, int], dict]:
    rows: dict[tuple[int, int], dict] = {}
    order = list(servers)
    for turn in range(args.rounds):
        for size in sizes:
            for level in levels:
                row = rows.setdefault((size, level), {"triton": [], "door": [], "ratios": []})
                cells = {}
                for name in order if turn % 2 == 0 else order[::-1]:
                    port = servers[name].http_port
                    cells[name] = uvloop.run(run_cell(port, size, level, args.seconds))
                    row[name].append(cells[name])
                if level == 1:
                    ratio = cells["door"].p50_ms / cells["triton"].p50_ms
                else:
                    ratio = cells["door"].rate / cells["triton"].rate
                row["ratios"].append(ratio)
                print(
                    f"round {turn + 1} FP32 x {size} c={level}: "
                    + ", ".join(
                        f"{name} {cell.rate:,.0f} req/s p50 {cell.p50_ms:.2f} ms"
                        for name, cell in cells.items()
                    ),
                    flush=True,
                )
    return rows


if __name__ == "__main__":
    sys.exit(main())
