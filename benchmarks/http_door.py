"""p50 latency over HTTP at concurrency 1: real Triton's HTTP port vs the bridge's HTTP door.

A measurement, not a test. Both servers run `benchmarks/repository` (the FP32 identity model),
started side by side with the test harness: Triton from the oracle environment
(DYNAMO_BRIDGE_ORACLE_PYTHON), the bridge as `python -m bridge --frontend triton`. One
`tritonclient.http` client sends FP32 × n with the binary tensor data extension both ways, as
Triton users do; the servers take turns in rounds, so that a noisy moment of the machine lands
on both. The run is bounded: `--max-seconds` (default 240) of measuring plus at most 2 × 60 s
of start-up. It refuses to measure when the 1-minute load average is 3 or more
(`--ignore-load` measures anyway).

    python -m benchmarks.http_door [--sizes 4,100000,1000000] [--requests 200] [--rounds 4]

Prints one table: p50 ms per size and server, and bridge ÷ triton (the issue's targets:
≤ 1.3 at every size, ≤ 1.0 from 100K).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.harness import BridgeServer, TritonOracle, oracle_unavailable_reason  # noqa: E402

REPOSITORY = ROOT / "benchmarks" / "repository"
MODEL = "identity_fp32"
STARTUP_TIMEOUT = 60.0
# Fewer requests for the biggest tensors: each takes tens of milliseconds.
_BIG = 500_000


def _requests_for(size: int, requests: int) -> int:
    return max(10, requests // 4) if size >= _BIG else requests


class Client:
    """One keep-alive tritonclient.http connection to a server and a prepared request."""

    def __init__(self, url: str, size: int) -> None:
        self.client = httpclient.InferenceServerClient(
            url, connection_timeout=60, network_timeout=60
        )
        self.array = np.arange(size, dtype=np.float32)
        self.inputs = [httpclient.InferInput("INPUT0", [size], "FP32")]
        self.inputs[0].set_data_from_numpy(self.array, binary_data=True)
        self.outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]

    def once(self) -> float:
        start = time.perf_counter()
        result = self.client.infer(MODEL, self.inputs, outputs=self.outputs)
        elapsed = time.perf_counter() - start
        self.last = result
        return elapsed

    def check(self) -> None:
        if not np.array_equal(self.last.as_numpy("OUTPUT0"), self.array):
            raise AssertionError("wrong answer")

    def close(self) -> None:
        self.client.close()


def measure(
    urls: dict[str, str], size: int, requests: int, rounds: int, deadline: float
) -> dict[str, float]:
    """p50 ms per server for FP32 × size: `rounds` turns of requests/rounds each."""
    clients = {name: Client(url, size) for name, url in urls.items()}
    times: dict[str, list[float]] = {name: [] for name in urls}
    try:
        for client in clients.values():  # warm-up, and one check of the answer
            for _ in range(3):
                client.once()
            client.check()
        per_round = max(1, _requests_for(size, requests) // rounds)
        for _ in range(rounds):
            for name, client in clients.items():
                for _ in range(per_round):
                    if time.monotonic() > deadline:
                        break
                    times[name].append(client.once())
    finally:
        for client in clients.values():
            client.close()
    return {name: 1000 * statistics.median(t) if t else float("nan") for name, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,100000,1000000")
    parser.add_argument("--requests", type=int, default=200, help="per server and size")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--max-seconds", type=float, default=240.0)
    parser.add_argument(
        "--ignore-load", action="store_true", help="measure on a busy machine too (noisy)"
    )
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    if load >= 3 and not args.ignore_load:
        print(f"load average {load:.1f} >= 3: not measuring", file=sys.stderr)
        return 2
    reason = oracle_unavailable_reason()
    if reason is not None:
        print(f"real Triton is unavailable: {reason}", file=sys.stderr)
        return 2
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        servers = {
            "triton": TritonOracle(
                REPOSITORY, log_path=Path(tmp) / "triton.log", startup_timeout=STARTUP_TIMEOUT
            ),
            "bridge": BridgeServer(
                REPOSITORY,
                "--frontend",
                "triton",
                log_path=Path(tmp) / "bridge.log",
                startup_timeout=STARTUP_TIMEOUT,
            ),
        }
        try:
            for server in servers.values():
                server.start()
            for server in servers.values():
                server.wait_model_ready(MODEL, timeout=STARTUP_TIMEOUT)
            urls = {name: server.http_url for name, server in servers.items()}
            deadline = time.monotonic() + args.max_seconds
            results = {}
            for size in sizes:
                results[size] = measure(urls, size, args.requests, args.rounds, deadline)
                row = ", ".join(f"{name} {ms:.2f} ms" for name, ms in results[size].items())
                print(f"FP32 x {size}: {row}", flush=True)
        finally:
            for server in servers.values():
                server.stop()
    print(
        f"\np50 ms at c=1 over HTTP, binary tensors both ways ({args.requests} requests per "
        f"server and size, fewer from {_BIG}; load average {load:.1f} at start)"
    )
    print("| FP32 × n | triton | bridge | bridge ÷ triton |")
    print("|---|---|---|---|")
    for size, row in results.items():
        ratio = row["bridge"] / row["triton"]
        print(f"| {size} | {row['triton']:.2f} | {row['bridge']:.2f} | {ratio:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
