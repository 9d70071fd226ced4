"""The server's resident memory over many reloads of one model that allocates 20 MiB.

    python -m benchmarks.reload_rss [--reloads 22] [--mib 20] [--requests 20] [--arena-max N]

Issue 22 (finding 11): on a reload-heavy server the RSS grew in steps (160 → 325 MB over 22
reloads of 20 MiB models), with every retired generation freed. The memory was free but held by
glibc's malloc: `keep_large_buffers` (bridge/tuning.py) keeps buffers up to 32 MiB in the heap
and lets each arena hold up to 128 MiB of free memory, and each generation's instance thread
allocates in an arena of its own. The manager now hands the free memory back
(`release_free_memory`, malloc_trim) once a burst of unloads is over.

The bridge runs in explicit mode; each reload is a `load` on the control port (a reload with no
gap), followed by `--requests` requests and the wait for the old generation's "successfully
unloaded" line. The server's VmRSS is read from /proc after the start and after each reload.
`--arena-max N` starts the server with glibc's MALLOC_ARENA_MAX=N.
Bounded: at most `--reloads` reloads, each waited for at most 60 s.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.harness.bridge_server import BridgeServer  # noqa: E402
from tests.harness.ports import free_port  # noqa: E402

CONFIG = """name: "ballast"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU, count: 1 } ]
"""
MODEL = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.ballast = np.ones({mib} << 20, np.uint8)  # allocated on the load's thread

    def execute(self, requests):
        out = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            scratch = np.ones({mib} << 20, np.uint8)  # a large buffer on the instance thread
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", values)]))
            del scratch
        return out
"""


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def load(port: int, name: str) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/repository/models/{name}/load",
        data=b"{}",
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200, response.status


def run(reloads: int, mib: int, requests: int, arena_max: int | None = None) -> dict:
    work = Path(tempfile.mkdtemp(prefix="reload-rss-"))
    model = work / "repo" / "ballast"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG)
    (model / "1" / "model.py").write_text(MODEL.format(mib=mib))
    port = free_port()
    server = BridgeServer(
        work / "repo",
        "--model-control-mode=explicit",
        "--load-model=ballast",
        f"--control-port={port}",
        log_path=work / "bridge.log",
        env={"MALLOC_ARENA_MAX": str(arena_max)} if arena_max else None,
    )
    server.start()
    tensor = grpcclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(np.ones(4, np.float32))
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert server.process is not None
    pid = server.process.pid
    samples = []
    try:
        for _ in range(requests):
            client.infer("ballast", [tensor])
        samples.append(rss_mib(pid))
        for generation in range(2, reloads + 2):
            load(port, "ballast")
            for _ in range(requests):
                client.infer("ballast", [tensor])
            gone = f"successfully unloaded 'ballast' (generation {generation - 1})"
            deadline = time.monotonic() + 60
            while gone not in server.log_text:
                assert time.monotonic() < deadline, f"generation {generation - 1} never unloaded"
                time.sleep(0.1)
            time.sleep(1.5)  # the release runs REFREEZE_DELAY after the last unload
            samples.append(rss_mib(pid))
    finally:
        client.close()
        server.stop()
    return {
        "reloads": reloads,
        "arena_max": arena_max,
        "mib_per_generation": mib,
        "rss_mib": [round(s) for s in samples],
        "growth_mib": round(samples[-1] - samples[0]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reloads", type=int, default=22)
    parser.add_argument("--mib", type=int, default=20)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--arena-max", type=int, default=None)
    args = parser.parse_args()
    print(json.dumps(run(args.reloads, args.mib, args.requests, args.arena_max)))


if __name__ == "__main__":
    main()
