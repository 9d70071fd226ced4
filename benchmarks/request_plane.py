"""The floor of a split door: Dynamo's request plane alone, between two processes on one host.

A server process serves one endpoint whose handler answers at once with a fixed answer; a
client process calls it one request at a time (concurrency 1, as issue 27's split cells). The
messages have the shapes the triton door and a worker exchange (docs/worker_protocol.md): an
FP32 × 4 request and answer in the bridge form, and a 100K / 1M request whose tensors travel in
shared memory (only the region's handle crosses). Both processes use file discovery and the
request plane given (`tcp`, or `nats` with a running nats-server at NATS_SERVER), on the CPUs
the servers of `benchmarks.run` get; so `door_split − door` in `benchmarks.run`'s table can be
set beside what the request plane costs on its own.

    python -m benchmarks.request_plane [--requests 2000] [--request-plane tcp]

Prints, per message shape: the round trip's p50 / p90, and each process's CPU time per request
(its Python thread and the runtime's tokio threads apart).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks.placement import choose

ENDPOINT = "bench.plane.generate"
_TENSOR = {"name": "INPUT0", "data_type": "Float32", "shape": [1, 4]}
_INLINE = [{"metadata": _TENSOR, "data": {"data_type": "Float32", "values": b"\0" * 16}}]
_SPANNED = [{"metadata": _TENSOR, "data": {"data_type": "Float32", "shm": [64, 400000]}}]
_REGION = "dynbridge-4026531836-1234-{}-p"
_ANSWER = {"model": "identity_fp32", "model_version": "1", "final": True}
SHAPES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # (request, answer) as the door and a worker send them
    "fp32_4 (bytes inline)": (
        {"bridge_form": 1, "model": "identity_fp32", "tensors": _INLINE},
        {**_ANSWER, "tensors": _INLINE},
    ),
    "fp32_100k (a region's handle)": (
        {
            "bridge_form": 1,
            "model": "identity_fp32",
            "tensors": _SPANNED,
            "shm": {
                "host": "0123456789abcdef/64/4026531836",
                "prefix": "dynbridge-4026531836-1234-1-",
                "threshold": 131072,
                "region": _REGION.format(2),
                "size": 1 << 20,
                "generation": 1,
                "reply": {"region": _REGION.format(3), "size": 1 << 20, "generation": 2},
            },
        },
        {**_ANSWER, "tensors": _SPANNED, "shm": {"region": _REGION.format(3), "size": 1 << 20}},
    ),
}


def _cpu_by_role(pid: int) -> dict[str, float]:
    """CPU seconds of `pid`'s threads: its Python ('python'), the runtime's ('tokio'), other."""
    out: dict[str, float] = collections.Counter()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/task/{task}/comm") as f:
                name = f.read().strip()
        except OSError:  # a thread that ended meanwhile
            continue
        role = "tokio" if name.startswith("tokio") else "python" if name == "python" else "other"
        out[role] += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


async def _serve(request_plane: str) -> None:
    from dynamo.runtime import DistributedRuntime

    runtime = DistributedRuntime(asyncio.get_running_loop(), "file", request_plane)
    answers = {json.dumps(req, default=len, sort_keys=True): ans for req, ans in SHAPES.values()}

    async def handler(request: dict, context: Any = None) -> Any:
        yield answers[json.dumps(request, default=len, sort_keys=True)]

    print("serving", flush=True)
    await runtime.endpoint(ENDPOINT).serve_endpoint(handler)


async def _call(server_pid: int, requests: int, request_plane: str) -> None:
    from dynamo.runtime import DistributedRuntime

    runtime = DistributedRuntime(asyncio.get_running_loop(), "file", request_plane)
    client = await runtime.endpoint(ENDPOINT).client()
    await asyncio.wait_for(client.wait_for_instances(), 60)
    instance = client.instance_ids()[0]
    print("| message | p50 ms | p90 ms | client CPU µs/req (python + tokio) | "
          "server CPU µs/req (python + tokio) |")  # fmt: skip
    print("|---|---:|---:|---|---|")
    for label, (request, _) in SHAPES.items():
        for _ in range(50):  # warm-up
            async for _item in await client.direct(request, instance, annotated=False):
                pass
        mine, theirs = _cpu_by_role(os.getpid()), _cpu_by_role(server_pid)
        times = []
        for _ in range(requests):
            start = time.perf_counter()
            async for _item in await client.direct(request, instance, annotated=False):
                pass
            times.append(time.perf_counter() - start)
        mine2, theirs2 = _cpu_by_role(os.getpid()), _cpu_by_role(server_pid)

        def per(before: dict[str, float], after: dict[str, float], role: str) -> float:
            return (after[role] - before[role]) / requests * 1e6

        deciles = statistics.quantiles(times, n=10)
        print(
            f"| {label} | {statistics.median(times) * 1e3:.2f} | {deciles[8] * 1e3:.2f} | "
            f"{per(mine, mine2, 'python'):.0f} + {per(mine, mine2, 'tokio'):.0f} | "
            f"{per(theirs, theirs2, 'python'):.0f} + {per(theirs, theirs2, 'tokio'):.0f} |"
        )
    runtime.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="per message shape")
    parser.add_argument("--request-plane", default="tcp", choices=("tcp", "nats"))
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--call", type=int, default=0, help=argparse.SUPPRESS)  # server pid
    args = parser.parse_args(argv)
    import uvloop

    if args.serve:
        uvloop.run(_serve(args.request_plane))
        return
    if args.call:
        uvloop.run(_call(args.call, args.requests, args.request_plane))
        return
    placement = choose("auto")
    if placement is not None:  # both processes where benchmarks.run puts the servers
        placement.pin_server_side()
    with tempfile.TemporaryDirectory(prefix="request-plane-") as workdir:
        env = dict(
            os.environ,
            DYN_FILE_KV=workdir,
            DYN_TCP_RPC_HOST="127.0.0.1",
            DYN_TCP_RESPONSE_STREAM_HOST="127.0.0.1",
        )
        command = [sys.executable, "-m", "benchmarks.request_plane"]
        plane = ["--request-plane", args.request_plane]
        server = subprocess.Popen([*command, "--serve", *plane], env=env, stdout=subprocess.PIPE)
        try:
            assert server.stdout is not None
            server.stdout.readline()  # "serving"
            subprocess.run(
                [*command, "--call", str(server.pid), "--requests", str(args.requests), *plane],
                env=env,
                check=True,
                timeout=600,
            )
        finally:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
