"""What BYTES requests cost the triton door in memory (issue 38, finding 7), and whether they hold
up another model's requests meanwhile.

One embedded server (`python -m bridge`, the triton door) serves tests/repositories/bytes_limits.
`--clients` threads send one `identity_bytes` request each at once, `--elements` strings of
`--size` bytes (default 16 × 100,000 × 38 B: 67 MB of payload), over one wire per round: gRPC,
HTTP with binary data, HTTP with JSON. A second client calls `small` (FP32 × 4) every 10 ms
meanwhile. Per round: the server's peak RSS (VmHWM, reset before the round) over its RSS before
it, divided by the payload, and the longest wait of a `small` request. Each wire gets its own
server, `--rounds` times; the table gives the range.

Triton is not in the table: its Python backend copies each request into the stub's shared
memory and the stub process decodes it, so the server's RSS alone does not compare.

    python -m benchmarks.bytes_memory                     # ~2 min
    python -m benchmarks.bytes_memory --wires http --rounds 2 --elements 20000
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.harness.bridge_server import BridgeServer
from tests.harness.repositories import materialize

WIRES = ("grpc", "http", "json")


def _rss(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for {pid}")


def _send(server: BridgeServer, wire: str, data: np.ndarray) -> None:
    if wire == "grpc":
        client = grpcclient.InferenceServerClient(server.grpc_url)
        tensor = grpcclient.InferInput("INPUT0", list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data)
        client.infer("identity_bytes", [tensor], client_timeout=300)
        return
    http = httpclient.InferenceServerClient(server.http_url, network_timeout=300)
    tensor = httpclient.InferInput("INPUT0", list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data, binary_data=wire == "http")
    http.infer("identity_bytes", [tensor])


def one_round(repository: Path, wire: str, args: argparse.Namespace) -> dict[str, Any]:
    data = np.array([b"x" * args.size] * args.elements, dtype=np.object_)
    with BridgeServer(repository) as server:
        assert server.process is not None
        pid = server.process.pid
        _send(server, wire, data[:10])  # warm: the connection, the model's first call
        base = _rss(pid, "VmRSS:")
        with open(f"/proc/{pid}/clear_refs", "w") as refs:
            refs.write("5")  # VmHWM starts again from the current RSS
        waits: list[float] = []
        stop = threading.Event()

        def small() -> None:
            client = grpcclient.InferenceServerClient(server.grpc_url)
            tensor = grpcclient.InferInput("INPUT0", [4], "FP32")
            tensor.set_data_from_numpy(np.ones(4, np.float32))
            while not stop.is_set():
                start = time.perf_counter()
                client.infer("small", [tensor])
                waits.append(time.perf_counter() - start)
                time.sleep(0.01)

        smalls = threading.Thread(target=small)
        smalls.start()
        clients = [
            threading.Thread(target=_send, args=(server, wire, data)) for _ in range(args.clients)
        ]
        started = time.perf_counter()
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join()
        took = time.perf_counter() - started
        stop.set()
        smalls.join()
        peak = _rss(pid, "VmHWM:")
    payload = args.clients * args.elements * (args.size + 4)  # as framed: a 4-byte length each
    return {
        "peak_over_payload": (peak - base) / payload,
        "small_wait_ms": max(waits) * 1000 if waits else float("nan"),
        "seconds": took,
        "payload_mb": payload / 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wires", default=",".join(WIRES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--elements", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=38)
    args = parser.parse_args(argv)
    wires = [w for w in args.wires.split(",") if w]
    if not set(wires) <= set(WIRES):
        parser.error(f"--wires: choose among {', '.join(WIRES)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bytes-memory-") as tmp:
        repository = materialize("bytes_limits", Path(tmp))
        for wire in wires:
            runs = [one_round(repository, wire, args) for _ in range(args.rounds)]
            ratios = [r["peak_over_payload"] for r in runs]
            small = [r["small_wait_ms"] for r in runs]
            rows.append(
                f"| {wire} | {runs[0]['payload_mb']:.1f} | {min(ratios):.2f}–{max(ratios):.2f} "
                f"| {min(small):.0f}–{max(small):.0f} |"
            )
    print("| wire | payload MB | peak RSS over payload | longest `small` wait, ms |")
    print("|---|---:|---:|---:|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
