"""Serve one repository and run Triton's own client scripts against it, inside a network
namespace of its own (started by the caller with `unshare --net`).

Triton's examples and qa tests hard-code localhost:8000 (HTTP), :8001 (gRPC) and :8002
(metrics). A fresh namespace has those ports free whatever else runs on the machine, and its
loopback is the only network it has. This script brings that loopback up, starts
`python -m bridge` on Triton's ports, waits until it is ready, runs each client command in turn
(each bounded in time), stops the server with SIGTERM and prints, last, one line
`RESULTS {json}`: each client command's exit status (100: the server never became ready, 124:
the client timed out) and the server's own. Everything goes to stdout for the test to read.

    unshare --net python netns_driver.py --repository R --cwd D [--server-arg A ...] \
        [--client-env NAME=VALUE ...] [--client-timeout S] [--server-log NAME] \
        --client "python client.py" [--client ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

READY_URL = "http://127.0.0.1:8000/v2/health/ready"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repository", required=True)
    parser.add_argument("--cwd", required=True)
    parser.add_argument("--server-arg", action="append", default=[])
    parser.add_argument("--client", action="append", default=[])
    parser.add_argument("--client-env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--client-timeout", type=float, default=180.0)
    parser.add_argument("--startup-timeout", type=float, default=120.0)
    # The file in --cwd that the server's output goes to: some qa tests read it by test.sh's name.
    parser.add_argument("--server-log", default="server.log")
    # A bound on the server's address space (bytes), for a folder whose models allocate large
    # tensors: a regression then fails the test instead of filling the shared machine.
    parser.add_argument("--server-memory-limit", type=int, default=0)
    args = parser.parse_args()

    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    log_path = Path(args.cwd) / args.server_log
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bridge",
                "--model-repository",
                args.repository,
                "--grpc-port",
                "8001",
                "--http-port",
                "8000",
                "--metrics-port",
                "8002",
                *args.server_arg,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=args.cwd,
            preexec_fn=_memory_limit(args.server_memory_limit),
        )
    results: dict[str, int] = {}
    ready = False
    try:
        ready = _wait_ready(server, args.startup_timeout)
        if not ready:
            print("SERVER NOT READY", flush=True)
        for command in args.client:
            results[command] = _run_client(command, args) if ready else 100
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            code = server.wait()
        print("----- server log -----", flush=True)
        print(log_path.read_text(errors="replace"), flush=True)
        print(
            "RESULTS " + json.dumps({"clients": results, "server": code, "ready": ready}),
            flush=True,
        )
    return 0


def _run_client(command: str, args: argparse.Namespace) -> int:
    print(f"----- $ {command}", flush=True)
    try:
        done = subprocess.run(
            shlex.split(command),
            cwd=args.cwd,
            env=_client_env(args.client_env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=args.client_timeout,
        )
    except subprocess.TimeoutExpired as exc:
        print((exc.stdout or b"").decode(errors="replace"), flush=True)
        print(f"CLIENT TIMED OUT after {args.client_timeout} s", flush=True)
        return 124
    print(done.stdout.decode(errors="replace"), flush=True)
    print(f"----- exit {done.returncode}", flush=True)
    return done.returncode


def _memory_limit(limit: int) -> Callable[[], None] | None:
    if not limit:
        return None

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


def _client_env(assignments: list[str]) -> dict[str, str]:
    """The driver's environment plus the `NAME=VALUE` pairs a test.sh exports for its client."""
    env = dict(os.environ)
    for assignment in assignments:
        name, _, value = assignment.partition("=")
        env[name] = value
    return env


def _wait_ready(server: subprocess.Popen[bytes], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(READY_URL, timeout=2) as answer:
                if answer.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
