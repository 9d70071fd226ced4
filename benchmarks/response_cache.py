"""A cached request's latency against an uncached one, on Triton 2.51 and the triton door.

`python -m benchmarks.response_cache [--requests N]`: both servers on tests/repositories/
response_cache with `--cache-config local,size=1048576`; one client, one request at a time, the
same FP32 × 4 input each time to `cached` (every request after the first is a hit) and to
`uncached` (every request runs `execute`). Prints the p50 / p99 in ms of each cell; bounded by
`--requests` per cell (default 500), so it stops by itself in well under a minute.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from tests.harness.bridge_server import BridgeServer
from tests.harness.oracle import TritonOracle, find_oracle
from tests.harness.repositories import materialize

CACHE = "--cache-config=local,size=1048576"


def latencies(client: grpcclient.InferenceServerClient, model: str, count: int) -> list[float]:
    array = np.arange(4, dtype=np.float32)
    tensor = grpcclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(array)
    for _ in range(20):  # warm-up (and the one miss that fills the cache)
        client.infer(model, [tensor])
    out = []
    for _ in range(count):
        start = time.perf_counter()
        client.infer(model, [tensor])
        out.append((time.perf_counter() - start) * 1000)
    return out


def summary(values: list[float]) -> str:
    values = sorted(values)
    p99 = values[min(len(values) - 1, int(0.99 * len(values)))]
    return f"{statistics.median(values):.3f} / {p99:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="cache-bench-"))
    # Both servers on one written-out copy: its models share `cached`'s model.py.
    root = materialize("response_cache", logs)
    caches = find_oracle().backends_dir.parent / "caches"
    servers = {
        "triton": TritonOracle(
            root, CACHE, f"--cache-directory={caches}", log_path=logs / "triton.log"
        ),
        "door": BridgeServer(root, CACHE, "--frontend", "triton", log_path=logs / "door.log"),
    }
    print("| server | uncached p50 / p99 ms | cached (hit) p50 / p99 ms |")
    print("|---|---|---|")
    for name, server in servers.items():
        with server:
            client = server.client()
            uncached = latencies(client, "uncached", args.requests)
            cached = latencies(client, "cached", args.requests)
            print(f"| {name} | {summary(uncached)} | {summary(cached)} |")


if __name__ == "__main__":
    main()
