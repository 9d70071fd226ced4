"""Scale-out: one `--role frontend` with one and then two `--role worker` processes, against the
embedded default (`--role all`), on one machine.

* **Throughput:** a CPU-bound model (`--work-ms`, default 10, of pure-Python CPU time per request,
  holding the GIL, one instance per worker) at concurrency `--concurrency`, served by one
  worker, then by two behind the same frontend. The ratio is what a second worker process
  buys; the embedded default's row is the same model in one process.
* **The cross-process hop:** the identity model on FP32 × n at concurrency 1, p50, through the
  frontend and one worker against the embedded default; the difference is what the hop adds.

Discovery `file`, request plane `tcp`, everything on 127.0.0.1. Clients are tritonclient gRPC
threads (benchmarks/closed_loop.py), the same for every server.

    python -m benchmarks.scale_out                        # ~1.5 min
    python -m benchmarks.scale_out --seconds 1 --latency-seconds 0.5 --sizes 4
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from benchmarks.closed_loop import closed_loop
from tests.harness.bridge_server import BridgeServer
from tests.harness.cluster import Cluster, start_all

BENCH_REPOSITORY = Path(__file__).resolve().parent / "repository"

BURN_PY = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

WORK_S = float(os.environ.get("SCALE_OUT_WORK_MS", "5")) / 1000


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            # CPU time of this thread, not wall time: on a busy machine a preempted loop
            # still burns the same work.
            end = time.thread_time() + WORK_S
            n = 0
            while time.thread_time() < end:  # pure Python: holds the GIL
                n += 1
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            outputs = [
                pb_utils.Tensor("Y", x + 1),
                pb_utils.Tensor("PID", np.array([os.getpid()], np.int64)),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""

BURN_CONFIG = """name: "burn"
backend: "python"
max_batch_size: 0
input [ { name: "X", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [
  { name: "Y", data_type: TYPE_FP32, dims: [ 4 ] },
  { name: "PID", data_type: TYPE_INT64, dims: [ 1 ] }
]
instance_group [ { count: 1, kind: KIND_CPU } ]
parameters { key: "BRIDGE_INSTANCE_KIND" value { string_value: "thread" } }
"""

_STARTUP_TIMEOUT = 120.0


def write_repository(root: Path) -> Path:
    """`burn` (CPU-bound) and `identity_fp32` (from benchmarks/repository)."""
    (root / "burn" / "1").mkdir(parents=True)
    (root / "burn" / "config.pbtxt").write_text(BURN_CONFIG)
    (root / "burn" / "1" / "model.py").write_text(BURN_PY)
    shutil.copytree(BENCH_REPOSITORY / "identity_fp32", root / "identity_fp32")
    return root


def _burn_inputs() -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("X", [4], "FP32")
    tensor.set_data_from_numpy(np.ones(4, np.float32))
    return [tensor]


def _identity_inputs(size: int) -> Any:
    def build() -> list[grpcclient.InferInput]:
        tensor = grpcclient.InferInput("INPUT0", [size], "FP32")
        tensor.set_data_from_numpy(np.arange(size, dtype=np.float32))
        return [tensor]

    return build


def _pid(result: grpcclient.InferResult) -> int:
    return int(result.as_numpy("PID")[0])


def _check_identity(url: str, size: int) -> None:
    """One request, its answer compared with its input: a wrong path must not be timed."""
    client = grpcclient.InferenceServerClient(url)
    try:
        inputs = _identity_inputs(size)()
        got = client.infer("identity_fp32", inputs, client_timeout=60).as_numpy("OUTPUT0")
        assert np.array_equal(got, np.arange(size, dtype=np.float32)), f"wrong answer at {size}"
    finally:
        client.close()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far, all its threads (Linux /proc)."""
    # Fields after the command's closing parenthesis start at field 3: utime and stime are
    # fields 14 and 15.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _throughput(url: str, args: argparse.Namespace, pids: dict[str, list[int]]) -> dict[str, Any]:
    """One throughput row; `pids` names the server processes whose CPU time is reported
    ({"frontend": [...], "workers": [...]}), per request, next to the client's own."""
    closed_loop(url, "burn", _burn_inputs, args.concurrency, args.warmup, warmup=0)
    before = {role: sum(map(_cpu_seconds, group)) for role, group in pids.items()}
    client_before = sum(os.times()[:2])
    load = closed_loop(
        url, "burn", _burn_inputs, args.concurrency, args.seconds, keep=_pid, warmup=0
    )
    used = {role: sum(map(_cpu_seconds, group)) - before[role] for role, group in pids.items()}
    used["client"] = sum(os.times()[:2]) - client_before
    summary = load.summary()
    summary["per_process"] = dict(Counter(load.results))
    answered = len(load.latencies_ms)
    summary["cpu_ms_per_request"] = {
        role: seconds * 1000 / answered if answered else None for role, seconds in used.items()
    }
    return summary


def _latency(url: str, size: int, args: argparse.Namespace) -> list[float]:
    load = closed_loop(
        url, "identity_fp32", _identity_inputs(size), 1, args.latency_seconds, warmup=0.3
    )
    if load.failures:
        raise RuntimeError(f"identity_fp32 × {size}: {load.failures[0]}")
    return load.latencies_ms


def _wait_both_serve(url: str, pids: set[int], timeout: float = 60.0) -> None:
    """Until answers came from every worker in `pids` (discovery of a new one may lag)."""
    client = grpcclient.InferenceServerClient(url)
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while not pids <= seen:
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers {sorted(pids - seen)} never answered")
            try:
                seen.add(_pid(client.infer("burn", _burn_inputs(), client_timeout=30)))
            except Exception:  # not discovered yet
                time.sleep(0.05)
    finally:
        client.close()


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    repository = write_repository(workdir / "repository")
    env = {"SCALE_OUT_WORK_MS": str(args.work_ms)}
    cluster = Cluster(workdir / "cluster", extra_env=env)
    embedded = BridgeServer(
        repository, env=env, log_path=workdir / "embedded.log", startup_timeout=_STARTUP_TIMEOUT
    )
    door = cluster.frontend(startup_timeout=_STARTUP_TIMEOUT)
    first = cluster.worker(repository, name="worker1", startup_timeout=_STARTUP_TIMEOUT)
    second = cluster.worker(repository, name="worker2", startup_timeout=_STARTUP_TIMEOUT)
    result: dict[str, Any] = {"args": vars(args), "latency": {}, "throughput": {}}
    try:
        start_all([door, first])
        embedded.start()
        for server in (embedded, door):
            for model in ("burn", "identity_fp32"):
                server.wait_model_ready(model, timeout=_STARTUP_TIMEOUT)

        # The hop: embedded and split take turns per round, so outside load hits both alike.
        for size in args.sizes:
            for url in (embedded.grpc_url, door.grpc_url):
                _check_identity(url, size)
            turns: dict[str, list[float]] = {"embedded": [], "split": []}
            for _ in range(args.rounds):
                turns["embedded"] += _latency(embedded.grpc_url, size, args)
                turns["split"] += _latency(door.grpc_url, size, args)
            result["latency"][str(size)] = {
                name: {"p50_ms": statistics.median(ms), "requests": len(ms)}
                for name, ms in turns.items()
            }

        assert embedded.process is not None
        result["throughput"]["embedded"] = _throughput(
            embedded.grpc_url, args, {"workers": [embedded.process.pid]}
        )
        embedded.stop()  # idle from here on, but out of the way
        result["throughput"]["1"] = _throughput(
            door.grpc_url, args, {"frontend": [door.pid], "workers": [first.pid]}
        )
        second.start()
        _wait_both_serve(door.grpc_url, {first.pid, second.pid})
        result["throughput"]["2"] = _throughput(
            door.grpc_url, args, {"frontend": [door.pid], "workers": [first.pid, second.pid]}
        )
        result["worker_pids"] = [first.pid, second.pid]
    finally:
        embedded.stop()
        cluster.stop()
    one, two = result["throughput"]["1"], result["throughput"]["2"]
    if one.get("throughput") and two.get("throughput"):
        result["throughput_ratio"] = two["throughput"] / one["throughput"]
    return result


def _fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def format_table(result: dict[str, Any]) -> str:
    args = result["args"]
    lines = [
        f"Scale-out on {os.cpu_count()} CPUs, discovery file, request plane tcp, 127.0.0.1",
        f"{result.get('date', '')}; 1-minute load average before / after: "
        + " / ".join(f"{x:.1f}" for x in result.get("load_average", [])),
        "",
        f"CPU-bound model ({args['work_ms']:g} ms of pure Python per request, one instance per "
        f"process), c={args['concurrency']}, {args['seconds']:g} s per row:",
        "",
        "| served by | req/s | p50 ms | p99 ms | answers per worker "
        "| CPU ms per request: frontend / workers / client | errors |",
        "|---|---:|---:|---:|---|---|---:|",
    ]
    labels = {
        "embedded": "embedded (`--role all`)",
        "1": "frontend + 1 worker",
        "2": "frontend + 2 workers",
    }
    for key, label in labels.items():
        row = result["throughput"].get(key)
        if row is None:
            continue
        shares = " / ".join(str(n) for n in sorted(row.get("per_process", {}).values()))
        cpu = row.get("cpu_ms_per_request", {})
        cpu_text = " / ".join(
            "-" if cpu.get(role) is None else f"{cpu[role]:.1f}"
            for role in ("frontend", "workers", "client")
        )
        lines.append(
            f"| {label} | {_fmt(row.get('throughput'), 0)} | {_fmt(row.get('p50_ms'))} "
            f"| {_fmt(row.get('p99_ms'))} | {shares or 'n/a'} | {cpu_text} "
            f"| {row.get('errors', 0)} |"
        )
    ratio = result.get("throughput_ratio")
    lines += [
        "",
        f"throughput, 2 workers / 1 worker: {_fmt(ratio, 2)}x",
        "",
        f"Cross-process hop: identity FP32 × n, c=1, p50 over {args['rounds']} interleaved "
        f"rounds of {args['latency_seconds']:g} s each:",
        "",
        "| FP32 × n | embedded p50 ms | frontend + worker p50 ms | added ms | ratio |",
        "|---:|---:|---:|---:|---:|",
    ]
    for size, cell in result["latency"].items():
        embedded, split = cell["embedded"]["p50_ms"], cell["split"]["p50_ms"]
        lines.append(
            f"| {int(size):,} | {embedded:.2f} | {split:.2f} | {split - embedded:+.2f} "
            f"| {split / embedded:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--work-ms", type=float, default=10.0, help="CPU work per request")
    parser.add_argument("--seconds", type=float, default=8.0, help="per throughput row")
    parser.add_argument("--warmup", type=float, default=1.0, help="before each throughput row")
    parser.add_argument(
        "--sizes",
        type=lambda text: [int(n) for n in text.split(",") if n],
        default=[4, 100_000, 1_000_000],
        help="FP32 element counts of the hop rows (default 4,100000,1000000)",
    )
    parser.add_argument("--latency-seconds", type=float, default=2.0, help="per round and side")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-scale-out-") as tmp:
        result = run(args, Path(tmp))
    result["date"] = started.strftime("%Y-%m-%d %H:%M UTC")
    # Other work on the machine moves every number here: say how busy it was.
    result["load_average"] = [load_before, os.getloadavg()[0]]
    print(format_table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
