"""Event-loop stalls under mixed load: a small client's latency while a big client runs.

    python -m benchmarks.loop_stalls [--seconds 15] [--big-elements 1000000] [--big-clients 1]

Starts the bridge on the `plain` identity model (tests/repositories/reload/models/plain, FP32 in,
the same FP32 out) and measures a client sending 4-FP32 requests back to back, first alone, then
while `--big-clients` threads send `--big-elements`-FP32 requests back to back. Whatever the
bridge does on Dynamo's event loop for a big request (decoding its lists, encoding the answer)
shows up as the small client's tail latency. Prints a table; run by hand, not by the tests.
Runtime is bounded by about twice `--seconds` plus start-up.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.harness.bridge_server import BridgeServer  # noqa: E402

MODEL = ROOT / "tests" / "repositories" / "reload" / "models" / "plain"
MAX_MESSAGE = 2**31 - 1


def _input(values: np.ndarray) -> grpcclient.InferInput:
    data = grpcclient.InferInput("INPUT0", list(values.shape), "FP32")
    data.set_data_from_numpy(values)
    return data


def small_latencies(url: str, seconds: float) -> tuple[list[float], int]:
    """Latencies (ms) of 4-FP32 requests sent back to back for `seconds`; and failures."""
    client = grpcclient.InferenceServerClient(url)
    request = [_input(np.arange(4, dtype=np.float32))]
    latencies: list[float] = []
    failures = 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            start = time.perf_counter()
            try:
                client.infer("plain", request)
            except Exception:
                failures += 1
                continue
            latencies.append((time.perf_counter() - start) * 1000)
    finally:
        client.close()
    return latencies, failures


class BigClients:
    """Threads sending big FP32 requests back to back until stopped."""

    def __init__(self, url: str, clients: int, elements: int) -> None:
        self.url = url
        self.elements = elements
        self.done = 0
        self.failures = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _run(self) -> None:
        options = [
            ("grpc.max_send_message_length", MAX_MESSAGE),
            ("grpc.max_receive_message_length", MAX_MESSAGE),
        ]
        client = grpcclient.InferenceServerClient(self.url, channel_args=options)
        request = [_input(np.ones(self.elements, dtype=np.float32))]
        try:
            while not self._stop.is_set():
                try:
                    client.infer("plain", request, client_timeout=60)
                    self.done += 1
                except Exception:
                    self.failures += 1
        finally:
            client.close()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--big-elements", type=int, default=1_000_000)
    parser.add_argument("--big-clients", type=int, default=1)
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="loop-stalls-"))
    repo = workdir / "repo"
    shutil.copytree(MODEL, repo / "plain", ignore=shutil.ignore_patterns("__pycache__"))
    server = BridgeServer(repo, "--model-control-mode", "none", log_path=workdir / "bridge.log")
    rows = []
    try:
        server.start()
        small_latencies(server.grpc_url, 1.0)  # warm-up
        alone, alone_failed = small_latencies(server.grpc_url, args.seconds)
        rows.append(("small alone", alone, alone_failed, 0))
        big = BigClients(server.grpc_url, args.big_clients, args.big_elements)
        big.start()
        time.sleep(1.0)  # let the big client reach a steady state
        mixed, mixed_failed = small_latencies(server.grpc_url, args.seconds)
        big.stop()
        rows.append(("small + big", mixed, mixed_failed, big.done))
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"big client: {args.big_clients} x {args.big_elements:,} FP32; {args.seconds:.0f} s each")
    print(f"{'phase':<14}{'requests':>10}{'failed':>8}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
          f"{'big done':>10}")
    for name, latencies, failed, big_done in rows:
        print(
            f"{name:<14}{len(latencies):>10}{failed:>8}{statistics.median(latencies):>9.2f}"
            f"{percentile(latencies, 0.99):>9.2f}{max(latencies):>9.2f}{big_done:>10}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
