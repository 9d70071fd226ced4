"""Event-loop stalls under mixed load: a small client's latency while a big client runs.

    python -m benchmarks.loop_stalls [--seconds 15] [--big-elements 1000000] [--big-clients 1]
                                     [--small http|grpc] [--big message|region]
                                     [--big-call unary|stream] [--split]

Starts the bridge on the `plain` identity model (tests/repositories/reload/models/plain, FP32 in,
the same FP32 out) and a copy of it, and measures a client sending 4-FP32 requests to the copy
back to back, first alone, then while `--big-clients` threads send `--big-elements`-FP32 requests
to `plain` back to back. Whatever the
bridge does on Dynamo's event loop for a big request shows up as the small client's tail
latency. The small client is HTTP by default: the HTTP wire runs on the event loop, while a
unary gRPC call to the process's own model runs on a thread of its own (`--small grpc`).

`--big region`: the big requests' input is in a system shared memory region and their output
goes to another. The input region is given to another uid (65534, which needs root), so that
the door reads it rather than mapping it (shm.py), as it reads every region for a worker in
another process: the read is what must not run on the event loop.

`--big-call stream`: the big requests go over one gRPC stream per big client, one at a time,
instead of unary calls: a stream's answers are made on the loop's path (servicer.py), so their
outputs' writes into regions are what must not run there.

`--split`: the door as `--role frontend` in front of one `--role worker` process (file discovery,
the tcp request plane): the door then reads and writes every region itself, the outputs too.

`--bridge PATH`: the checkout whose bridge runs (default: this one), for a before/after of
two checkouts.

Prints a table; run by hand, not by the tests. Runtime is bounded by about twice `--seconds`
plus start-up.
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.harness.bridge_server import BridgeServer  # noqa: E402
from tests.harness.cluster import Cluster  # noqa: E402

MODEL = ROOT / "tests" / "repositories" / "reload" / "models" / "plain"
MAX_MESSAGE = 2**31 - 1
SMALL_MODEL = "plain_small"


def _input(values: np.ndarray) -> grpcclient.InferInput:
    data = grpcclient.InferInput("INPUT0", list(values.shape), "FP32")
    data.set_data_from_numpy(values)
    return data


def small_latencies(server: BridgeServer, wire: str, seconds: float) -> tuple[list[float], int]:
    """Latencies (ms) of 4-FP32 requests sent back to back for `seconds` over `wire`; and
    failures."""
    if wire == "grpc":
        client = grpcclient.InferenceServerClient(server.grpc_url)
        request = [_input(np.arange(4, dtype=np.float32))]

        def send() -> None:
            client.infer(SMALL_MODEL, request)

        close = client.close
    else:
        http = httpx.Client(base_url=f"http://{server.http_url}")
        body = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1] * 4}]}

        def send() -> None:
            http.post(f"/v2/models/{SMALL_MODEL}/infer", json=body).raise_for_status()

        close = http.close
    latencies: list[float] = []
    failures = 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            start = time.perf_counter()
            try:
                send()
            except Exception:
                failures += 1
                continue
            latencies.append((time.perf_counter() - start) * 1000)
    finally:
        close()
    return latencies, failures


class Regions:
    """The big requests' input region (another uid's: read, not mapped) and output region."""

    def __init__(self, url: str, elements: int) -> None:
        self.size = 4 * elements
        tag = f"loop_stalls_{os.getpid()}"
        self.handles: list = []
        self.client = grpcclient.InferenceServerClient(url)
        try:
            for part in ("in", "out"):  # registered as "in" and "out"
                key = f"/{tag}_{part}"
                self.handles.append(shm.create_shared_memory_region(key[1:], key, self.size))
                self.client.register_system_shared_memory(part, key, self.size)
            shm.set_shared_memory_region(self.handles[0], [np.ones(elements, dtype=np.float32)])
            os.chown(f"/dev/shm/{tag}_in", 65534, 65534)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        try:
            self.client.unregister_system_shared_memory()
            self.client.close()
        finally:
            for handle in self.handles:
                shm.destroy_shared_memory_region(handle)


class BigClients:
    """Threads sending big FP32 requests back to back until stopped."""

    def __init__(
        self, url: str, clients: int, elements: int, regions: Regions | None, stream: bool
    ) -> None:
        self.url = url
        self.elements = elements
        self.regions = regions
        self.stream = stream
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
        outputs = None
        if self.regions is None:
            request = [_input(np.ones(self.elements, dtype=np.float32))]
        else:
            placed = grpcclient.InferInput("INPUT0", [self.elements], "FP32")
            placed.set_shared_memory("in", self.regions.size)
            request = [placed]
            output = grpcclient.InferRequestedOutput("OUTPUT0")
            output.set_shared_memory("out", self.regions.size)
            outputs = [output]
        send = self._streamed(client) if self.stream else client.infer
        try:
            while not self._stop.is_set():
                try:
                    send("plain", request, outputs=outputs, client_timeout=60)
                    self.done += 1
                except Exception:
                    self.failures += 1
        finally:
            if self.stream:
                client.stop_stream()
            client.close()

    @staticmethod
    def _streamed(client: grpcclient.InferenceServerClient) -> Callable[..., None]:
        """A `client.infer` look-alike that sends over one stream and waits for the answer."""
        answers: queue.SimpleQueue = queue.SimpleQueue()
        client.start_stream(callback=lambda result, error: answers.put(error))

        def send(model: str, inputs: list, outputs: list | None, client_timeout: float) -> None:
            client.async_stream_infer(model, inputs, outputs=outputs)
            error = answers.get(timeout=client_timeout)
            if error is not None:
                raise error

        return send


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
    parser.add_argument("--small", choices=("http", "grpc"), default="http")
    parser.add_argument("--big", choices=("message", "region"), default="message")
    parser.add_argument("--big-call", choices=("unary", "stream"), default="unary")
    parser.add_argument("--split", action="store_true", help="door and worker apart")
    parser.add_argument("--bridge", type=Path, default=ROOT, help="the checkout to run")
    args = parser.parse_args(argv)
    if args.big == "region" and os.geteuid() != 0:
        print("--big region gives its input region to another uid: run it as root")
        return 2

    workdir = Path(tempfile.mkdtemp(prefix="loop-stalls-"))
    repo = workdir / "repo"
    shutil.copytree(MODEL, repo / "plain", ignore=shutil.ignore_patterns("__pycache__"))
    # The small client's own copy: its requests never wait behind a big one in the model's
    # queue, so what delays them is the bridge's shared parts (the loop, the GIL).
    shutil.copytree(MODEL, repo / SMALL_MODEL, ignore=shutil.ignore_patterns("__pycache__"))
    config = repo / SMALL_MODEL / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "plain"', f'name: "{SMALL_MODEL}"'))
    env = {"PYTHONPATH": str(args.bridge.resolve())}
    server: BridgeServer
    cluster: Cluster | None = None
    if args.split:
        cluster = Cluster(workdir / "cluster")
        cluster.worker(repo, env=env, cwd=workdir).start()
        server = cluster.frontend("--allow-client-shm=true", env=env, cwd=workdir)
    else:
        server = BridgeServer(
            repo,
            "--model-control-mode",
            "none",
            "--allow-client-shm=true",
            env=env,
            log_path=workdir / "bridge.log",
            cwd=workdir,  # `python -m bridge` would take the current folder's first
        )
    rows = []
    regions: Regions | None = None
    try:
        server.start()
        server.wait_model_ready("plain")
        server.wait_model_ready(SMALL_MODEL)
        small_latencies(server, args.small, 1.0)  # warm-up
        alone, alone_failed = small_latencies(server, args.small, args.seconds)
        rows.append(("small alone", alone, alone_failed, 0))
        if args.big == "region":
            regions = Regions(server.grpc_url, args.big_elements)
        big = BigClients(
            server.grpc_url, args.big_clients, args.big_elements, regions, args.big_call == "stream"
        )
        big.start()
        time.sleep(1.0)  # let the big client reach a steady state
        mixed, mixed_failed = small_latencies(server, args.small, args.seconds)
        big.stop()
        rows.append(("small + big", mixed, mixed_failed, big.done))
    finally:
        if regions is not None:
            regions.close()
        server.stop()
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    print(
        f"small client: {args.small}; big client: {args.big_clients} x {args.big_elements:,} "
        f"FP32 in the {args.big}, {args.big_call} calls; "
        f"{'door and worker apart' if args.split else 'one process'}; {args.seconds:.0f} s each"
    )
    print(
        f"{'phase':<14}{'requests':>10}{'failed':>8}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
        f"{'big done':>10}"
    )
    for name, latencies, failed, big_done in rows:
        print(
            f"{name:<14}{len(latencies):>10}{failed:>8}{statistics.median(latencies):>9.2f}"
            f"{percentile(latencies, 0.99):>9.2f}{max(latencies):>9.2f}{big_done:>10}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
