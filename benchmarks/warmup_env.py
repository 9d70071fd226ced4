"""What `model_warmup` and the environment cache buy, on Triton 2.51 and the bridge, in one run.

`python -m benchmarks.warmup_env [--rounds N]`:

* **First request after start-up**, for a model whose first `execute` pays a lazy
  initialization (about 0.5 s of work: `lazy_init` below), with and without a `model_warmup`
  sample: each server is started afresh per round and its first request timed (gRPC, one
  client). With warmup, the start-up pays and the first client does not.
* **Start-up of a model in its own Python environment** (`EXECUTION_ENV_PATH`, a packed venv
  with numpy 1.x, made once here): the bridge with an empty environment cache (it unpacks),
  then with the cache it left (it reuses the unpacked folder, found by content), against Triton,
  which unpacks the archive at every start. Timed from the process's start to ServerReady.

Prints one table (median of the rounds, ms). Bounded: `--rounds` (default 3) starts per cell.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from model_repository_loader.isolation.environments import CACHE_ENV
from tests.harness.bridge_server import BridgeServer
from tests.harness.oracle import TritonOracle, find_oracle

LAZY_MODEL = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    table = None

    def execute(self, requests):
        if self.table is None:  # lazy initialization: what the first request would pay
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:
                np.sort(np.random.rand(10000))
            self.table = np.ones(1, np.float32)
        out = pb_utils.Tensor("OUT", self.table)
        return [pb_utils.InferenceResponse([out]) for _ in requests]
"""
OUT = 'output [{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }]\n'
WARMUP = (
    'model_warmup [{ name: "first" batch_size: 1 '
    'inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } } }]\n'
)
INPUT = 'input [{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }]\n'
ENV_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = np.array([np.NINF], dtype=np.float32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]) for _ in requests]
"""


def _model(root: Path, name: str, source: str, config: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(source)
    (root / name / "config.pbtxt").write_text('backend: "python"\n' + config)


def _first_request_ms(server: BridgeServer | TritonOracle) -> float:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    tensor = grpcclient.InferInput("X", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, np.float32))
    start = time.perf_counter()
    client.infer("lazy", [tensor])
    return (time.perf_counter() - start) * 1000


def _started_ms(make: Callable[[], BridgeServer | TritonOracle]) -> float:
    """From the process's start until it answers ServerReady."""
    start = time.perf_counter()
    with make():
        return (time.perf_counter() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    find_oracle()
    work = Path(tempfile.mkdtemp(prefix="warmup-env-"))
    try:
        rows = []
        for label, config in (("no warmup", INPUT + OUT), ("warmup", INPUT + OUT + WARMUP)):
            repo = work / label.replace(" ", "_")
            _model(repo, "lazy", LAZY_MODEL, config)
            for door, make in (
                ("Triton 2.51", lambda r=repo: TritonOracle(r)),
                ("bridge", lambda r=repo: BridgeServer(r)),
            ):
                times = []
                for _ in range(args.rounds):
                    with make() as server:
                        times.append(_first_request_ms(server))
                rows.append((f"first request, {label}", door, statistics.median(times)))

        env = work / "numpy1-env"
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        subprocess.run(
            [str(env / "bin/python"), "-m", "pip", "install", "-q", "numpy<2"], check=True
        )
        repo = work / "env_repo"
        _model(
            repo,
            "numpy1",
            ENV_MODEL,
            OUT + 'parameters { key: "EXECUTION_ENV_PATH" value { string_value: '
            '"$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }\n',
        )
        with tarfile.open(repo / "numpy1" / "env.tar.gz", "w:gz") as archive:
            archive.add(env, arcname=".")
        cache = work / "cache"
        cold, warm, triton = [], [], []
        for _ in range(args.rounds):
            shutil.rmtree(cache, ignore_errors=True)
            cold.append(_started_ms(lambda: BridgeServer(repo, env={CACHE_ENV: str(cache)})))
            warm.append(_started_ms(lambda: BridgeServer(repo, env={CACHE_ENV: str(cache)})))
            triton.append(_started_ms(lambda: TritonOracle(repo)))
        what = "start-up, environment archive"
        rows.append((what, "Triton 2.51 (unpacks at every start)", statistics.median(triton)))
        rows.append((what, "bridge, empty cache (unpacks)", statistics.median(cold)))
        rows.append((what, "bridge, cache reused", statistics.median(warm)))
        print(f"| what | server | median of {args.rounds}, ms |")
        print("|---|---|---|")
        for what, server, value in rows:
            print(f"| {what} | {server} | {value:.0f} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
