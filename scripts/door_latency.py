"""p50 latency at concurrency 1: `--frontend triton` vs `--frontend dynamo` vs real Triton.

A measurement, not a test: run it on a quiet machine (it refuses when the 1-minute load average
is 3 or more). Each server runs alone, on the same one-model repository (an FP32 identity),
with one `tritonclient.grpc` client sending raw inputs, as Triton users do:

    python scripts/door_latency.py [--requests 200] [--sizes 4,100000,1000000]

Needs the oracle environment (DYNAMO_BRIDGE_ORACLE_PYTHON) for the Triton column.
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
import tritonclient.grpc as grpcclient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.harness import BridgeServer, TritonOracle, oracle_unavailable_reason  # noqa: E402

MODEL = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            array = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", array)]))
        return out
"""
CONFIG = """name: "identity_fp32"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""


def write_repository(folder: Path) -> Path:
    model = folder / "identity_fp32"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG)
    (model / "1" / "model.py").write_text(MODEL)
    return folder


def p50_ms(url: str, size: int, requests: int) -> float:
    client = grpcclient.InferenceServerClient(url)
    try:
        array = np.arange(size, dtype=np.float32)
        tensor = grpcclient.InferInput("INPUT0", [size], "FP32")
        tensor.set_data_from_numpy(array)
        for _ in range(max(5, requests // 10)):  # warm-up
            client.infer("identity_fp32", [tensor])
        times = []
        for _ in range(requests):
            start = time.perf_counter()
            result = client.infer("identity_fp32", [tensor])
            times.append(time.perf_counter() - start)
        if not np.array_equal(result.as_numpy("OUTPUT0"), array):
            raise AssertionError("wrong answer")
        return 1000 * statistics.median(times)
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--sizes", default="4,100000,1000000")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    if load >= 3:
        print(f"load average {load:.1f} >= 3: not measuring", file=sys.stderr)
        return 2
    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict[str, dict[int, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        repository = write_repository(Path(tmp) / "repository")
        servers = {
            "bridge --frontend triton": lambda: BridgeServer(
                repository, "--frontend", "triton", log_path=Path(tmp) / "triton-door.log"
            ),
            "bridge --frontend dynamo": lambda: BridgeServer(
                repository, "--frontend", "dynamo", log_path=Path(tmp) / "dynamo.log"
            ),
        }
        if oracle_unavailable_reason() is None:
            servers["triton 2.51"] = lambda: TritonOracle(
                repository, log_path=Path(tmp) / "tritonserver.log"
            )
        for name, make in servers.items():
            with make() as server:
                server.wait_model_ready("identity_fp32")
                results[name] = {n: p50_ms(server.grpc_url, n, args.requests) for n in sizes}
            print(f"{name}: " + ", ".join(f"{n}: {ms:.2f} ms" for n, ms in results[name].items()))
    print(f"\np50 ms at c=1 ({args.requests} requests each; load average {load:.1f} at start)")
    print("| server | " + " | ".join(f"FP32 x {n}" for n in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for name, row in results.items():
        print(f"| {name} | " + " | ".join(f"{row[n]:.2f}" for n in sizes) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
