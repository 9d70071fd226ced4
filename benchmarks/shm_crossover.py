"""Where the shared memory form between a triton door and a worker on one host starts to pay
(bridge/transport/, docs/benchmarks.md "Shared memory between door and worker").

Two split pairs (`--role worker` + `--role frontend --frontend triton`, file discovery, tcp on
127.0.0.1) serve `benchmarks/repository/identity_fp32`: one with every tensor in shared memory
(`DYN_BRIDGE_SHM_THRESHOLD=1`), one whose worker says it is on another host
(`DYN_BRIDGE_SHM_HOST_ID`), so it gets the bytes form. Requests alternate between the two, size
by size, with tritonclient; prints p50 per size and form. Bounded: `--requests` per size and
form (default 200), six sizes.

    python -m benchmarks.shm_crossover [--requests N] [--sizes 1024,65536,...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from tests.harness.cluster import Cluster, start_all

REPOSITORY = Path(__file__).parent / "repository"
SIZES = (1024, 4096, 16384, 65536, 262144, 1_000_000)
MODEL = "identity_fp32"


def _pair(workdir: Path, name: str, worker_env: dict[str, str], door_env: dict[str, str]):
    cluster = Cluster(workdir / name)
    worker = cluster.worker(REPOSITORY, env=worker_env)
    door = cluster.frontend("--frontend", "triton", env=door_env)
    start_all([worker, door])
    door.wait_model_ready(MODEL, timeout=120)
    return cluster, door.client()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="per size and form")
    parser.add_argument(
        "--sizes", default=",".join(map(str, SIZES)), help="FP32 elements, comma-separated"
    )
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",") if n.strip()]
    with tempfile.TemporaryDirectory(prefix="shm_crossover_") as folder:
        workdir = Path(folder)
        shm_pair, shm = _pair(workdir, "shm", {}, {"DYN_BRIDGE_SHM_THRESHOLD": "1"})
        bytes_pair, raw = _pair(workdir, "bytes", {"DYN_BRIDGE_SHM_HOST_ID": "elsewhere"}, {})
        try:
            print("| FP32 elements | bytes | shm p50 ms | bytes form p50 ms | shm ÷ bytes |")
            print("|---:|---:|---:|---:|---:|")
            for n in sizes:
                values = np.arange(n, dtype=np.float32)
                tensor = grpcclient.InferInput("INPUT0", [n], "FP32")
                tensor.set_data_from_numpy(values)
                times: dict[str, list[float]] = {"shm": [], "bytes": []}
                for client in (shm, raw):  # warm-up
                    for _ in range(5):
                        client.infer(MODEL, [tensor])
                for i in range(args.requests):
                    turns = [("shm", shm), ("bytes", raw)]
                    for form, client in turns if i % 2 else reversed(turns):
                        began = time.perf_counter()
                        result = client.infer(MODEL, [tensor])
                        times[form].append(time.perf_counter() - began)
                        assert np.array_equal(result.as_numpy("OUTPUT0"), values)
                a = statistics.median(times["shm"]) * 1e3
                b = statistics.median(times["bytes"]) * 1e3
                print(f"| {n:,} | {4 * n:,} | {a:.2f} | {b:.2f} | {a / b:.2f} |", flush=True)
        finally:
            shm_pair.stop()
            bytes_pair.stop()


if __name__ == "__main__":
    main()
