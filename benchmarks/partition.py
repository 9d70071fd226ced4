"""A partition with a replica (issue 39): three simulated hosts, one worker cut off under load.

Hosts (network namespaces on a private bridge, tests/harness/hosts.py; as root):
`a` runs etcd and the triton door (`--role frontend`), `b` and `c` one `--role worker` each
with the same model; the client threads run in this process's own namespace and reach the
door over the bridge, on the TCP request plane, as docs/deployment.md "Several hosts" says.

The clients load `add_sub` (closed loop, `--concurrency` threads) for `--seconds`; `b` is cut
off (frames dropped both ways) at `--cut-at` for `--cut-for` seconds, then joined again. The
table gives, second by second, the answers and the failures, and the summary:

* healthy: answers/s before the cut;
* during the cut, after its first second, as a share of healthy (target ≥ 80%);
* failed requests, against the requests that can have been in flight on `b` at the cut (at most
  the concurrency; target: no more failures than that);
* when `b` serves again after the link is back (its share of the answers, from its own metrics).

There is no Triton column: Triton has no several-host mode to compare with.

    sudo python -m benchmarks.partition                 # ~1.5 min
    python -m benchmarks.partition --seconds 20 --cut-at 5 --cut-for 8 --concurrency 8
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from tests.harness.hosts import Network, accepts, http_status
from tests.harness.services import ensure_binary

REPOSITORY = Path(__file__).resolve().parent.parent / "examples" / "model_repository"
ETCD_PORT, DOOR_PORT, METRICS_PORT = 2379, 8001, 8002


# What a host's processes must not inherit from the caller (a test run pins some of them to
# 127.0.0.1 for one-host clusters): each host says its own.
_PER_HOST = ("DYN_TCP_", "DYN_DISCOVERY", "DYN_REQUEST_PLANE", "DYN_FILE_KV", "ETCD_", "NATS_")


def _environment(host_address: str, etcd: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_PER_HOST)}
    env.update(
        DYN_DISCOVERY_BACKEND="etcd",
        ETCD_ENDPOINTS=etcd,
        DYN_LOG="warn",
        # Each simulated host is its own machine for the bridge's shared memory.
        DYN_BRIDGE_SHM_HOST_ID=f"host-{host_address}",
        PYTHONPATH=str(Path(__file__).resolve().parent.parent),
    )
    env.update(extra)
    return env


def start_cluster(
    network: Network,
    workdir: Path,
    repository: Path = REPOSITORY,
    worker_hosts: tuple[str, ...] = ("b", "c"),
) -> dict[str, Any]:
    """etcd and the door on host `a`, a worker serving `repository` on each of `worker_hosts`;
    returns once the door answers on gRPC (the caller waits for its models)."""
    a = network["a"]
    etcd_url = f"http://{a.address}:{ETCD_PORT}"
    etcd = a.spawn(
        [
            ensure_binary("etcd"),
            "--data-dir",
            str(workdir / "etcd"),
            "--listen-client-urls",
            etcd_url,
            "--advertise-client-urls",
            etcd_url,
            "--listen-peer-urls",
            "http://127.0.0.1:2380",
        ],
        name="etcd",
    )
    etcd.wait_http(f"{etcd_url}/health")
    bridge = [sys.executable, "-m", "bridge"]
    workers = {}
    for name in worker_hosts:
        host = network[name]
        env = _environment(host.address, etcd_url, DYN_TCP_RPC_HOST=host.address)
        workers[name] = host.spawn(
            [
                *bridge,
                "--role",
                "worker",
                "--model-repository",
                str(repository),
                "--metrics-port",
                str(METRICS_PORT),
                "--metrics-address",
                host.address,
            ],
            env=env,
            name="worker",
        )
    env = _environment(a.address, etcd_url, DYN_TCP_RESPONSE_STREAM_HOST=a.address)
    door = a.spawn(
        [*bridge, "--role", "frontend", "--host", a.address, "--grpc-port", str(DOOR_PORT)],
        env=env,
        name="frontend",
    )
    door.wait_until(lambda: accepts(a.address, DOOR_PORT), "the door's gRPC port", 120.0)
    return {"url": f"{a.address}:{DOOR_PORT}", "door": door, "workers": workers}


def executions(address: str) -> float:
    """add_sub's executions so far on the worker at `address`, from its metrics."""
    import urllib.request

    with urllib.request.urlopen(f"http://{address}:{METRICS_PORT}/metrics", timeout=2) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("nv_inference_exec_count") and 'model="add_sub"' in line:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_both_serve(network: Network, url: str, timeout: float = 120.0) -> None:
    client = grpcclient.InferenceServerClient(url)
    inputs = add_sub_inputs()
    deadline = time.monotonic() + timeout
    hosts = [network["b"].address, network["c"].address]
    while time.monotonic() < deadline:
        if all(http_status(f"http://{h}:{METRICS_PORT}/metrics") == 200 for h in hosts):
            try:
                for _ in range(8):
                    client.infer("add_sub", inputs, client_timeout=5)
                if all(executions(h) > 0 for h in hosts):
                    return
            except Exception:
                pass
        time.sleep(0.5)
    raise RuntimeError("the two workers did not both serve add_sub through the door")


def add_sub_inputs() -> list[grpcclient.InferInput]:
    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    inputs = [grpcclient.InferInput(n, [1, 4], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(data)
    return inputs


def load(url: str, args: argparse.Namespace, network: Network) -> dict[str, Any]:
    answered: collections.Counter[int] = collections.Counter()
    failed: collections.Counter[int] = collections.Counter()
    errors: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    start = time.monotonic()
    end = start + args.seconds

    def client() -> None:
        connection = grpcclient.InferenceServerClient(url)
        inputs = add_sub_inputs()
        while time.monotonic() < end:
            try:
                connection.infer("add_sub", inputs, client_timeout=args.client_timeout)
                ok = True
            except Exception as exc:
                ok = False
                text = str(exc)[:120]
            second = int(time.monotonic() - start)
            with lock:
                if ok:
                    answered[second] += 1
                else:
                    failed[second] += 1
                    errors[text] += 1

    threads = [threading.Thread(target=client, daemon=True) for _ in range(args.concurrency)]
    for thread in threads:
        thread.start()
    b = network["b"]
    time.sleep(max(0.0, start + args.cut_at - time.monotonic()))
    b.cut()
    time.sleep(max(0.0, start + args.cut_at + args.cut_for - time.monotonic()))
    b.restore()
    restored = time.monotonic() - start
    b_before = _executions_retrying(b.address)
    for thread in threads:
        thread.join(args.client_timeout + 10)
    b_after = _executions_retrying(b.address)
    # A cut longer than etcd's lease makes b start itself again (docs/deployment.md): its
    # counters then start from 0.
    restarted = b_after < b_before
    return {
        "answered": [answered[s] for s in range(args.seconds)],
        "failed": [failed[s] for s in range(args.seconds)],
        "errors": dict(errors.most_common(5)),
        "restored_at_s": round(restored, 1),
        "b_executions_after_restore": b_after if restarted else b_after - b_before,
        "b_restarted": restarted,
    }


def _executions_retrying(address: str) -> float:
    for _ in range(20):
        try:
            return executions(address)
        except OSError:
            time.sleep(0.5)
    return float("nan")


def summarize(result: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    answered, failed = result["answered"], result["failed"]
    cut, cut_end = args.cut_at, args.cut_at + args.cut_for
    before = answered[1:cut]  # the first second warms the connections up
    during = answered[cut + 1 : cut_end]
    healthy = sum(before) / max(1, len(before))
    kept = sum(during) / max(1, len(during))
    return {
        "healthy_per_s": round(healthy),
        "cut_after_first_second_per_s": round(kept),
        "kept_share": round(kept / healthy, 2) if healthy else None,
        "failed": sum(failed),
        "failed_bound": args.concurrency,
        "b_served_after_restore": result["b_executions_after_restore"],
        "b_restarted": result["b_restarted"],
    }


def format_table(result: dict[str, Any], summary: dict[str, Any], args: argparse.Namespace) -> str:
    lines = ["| second | answered | failed | |", "|---:|---:|---:|---|"]
    for second, (ok, bad) in enumerate(zip(result["answered"], result["failed"], strict=True)):
        mark = ""
        if second == args.cut_at:
            mark = "b cut off"
        elif second == args.cut_at + args.cut_for:
            mark = "b joined again"
        lines.append(f"| {second} | {ok} | {bad} | {mark} |")
    lines += [
        "",
        f"healthy: {summary['healthy_per_s']} req/s; during the cut, after its first second: "
        f"{summary['cut_after_first_second_per_s']} req/s ({summary['kept_share']} of healthy, "
        f"target ≥ 0.8)",
        f"failed: {summary['failed']} (requests in flight on b at the cut: at most "
        f"{summary['failed_bound']}, the concurrency)",
        f"b executed {summary['b_served_after_restore']:.0f} requests after it was joined again",
    ]
    if summary["b_restarted"]:
        lines[-1] += " (it had lost its etcd lease and started itself again)"
    if result["errors"]:
        lines.append("errors: " + json.dumps(result["errors"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=40)
    parser.add_argument("--cut-at", type=int, default=10)
    parser.add_argument("--cut-for", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--client-timeout", type=float, default=60.0)
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    if not 1 <= args.cut_at < args.cut_at + args.cut_for < args.seconds:
        parser.error("need 1 <= --cut-at < --cut-at + --cut-for < --seconds")
    with (
        tempfile.TemporaryDirectory(prefix="partition-") as tmp,
        Network(["a", "b", "c"], workdir=Path(tmp) / "hosts") as network,
    ):
        cluster = start_cluster(network, Path(tmp))
        wait_both_serve(network, cluster["url"])
        result = load(cluster["url"], args, network)
        summary = summarize(result, args)
        print(format_table(result, summary, args))
        if args.json:
            Path(args.json).write_text(json.dumps({"result": result, "summary": summary}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
