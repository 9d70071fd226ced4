"""Triton's own example clients and qa tests, unmodified, against the bridge.

`triton-upstream.tar.gz` holds files of two public repositories, as they are at a pinned
release (README.md says which, and how the archive is made); nothing is fetched at run time.
`unpack()` gives them in a temporary folder; `run_in_namespace()` serves a repository laid out
from them on Triton's fixed ports inside a network namespace of its own (netns_driver.py) and
runs their client scripts there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ARCHIVE = HERE / "triton-upstream.tar.gz"
PROJECT_ROOT = HERE.parents[1]


def unpack(into: Path) -> Path:
    """The archive's folders (`server/`, `python_backend/`) under `into`."""
    with tarfile.open(ARCHIVE) as archive:
        archive.extractall(into, filter="data")
    return into


def place(source: Path, target: Path) -> None:
    """Copy one file, making its folders: the `mkdir -p` + `cp` of the upstream READMEs."""
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


@dataclass
class Run:
    """What one namespace run printed, and each client's exit status."""

    output: str
    clients: dict[str, int]
    server_status: int
    ready: bool = True

    def client_output(self, command: str) -> str:
        start = self.output.find(f"----- $ {command}\n")
        if start < 0:
            return self.output[-20000:]
        end = self.output.find("----- exit", start)
        return self.output[start : end if end > 0 else None]


def namespaces_available() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True)
    return probe.returncode == 0


def run_in_namespace(
    repository: Path,
    cwd: Path,
    clients: list[str],
    server_args: tuple[str, ...] = (),
    timeout: float = 900.0,
    client_env: dict[str, str] | None = None,
    client_timeout: float = 180.0,
    server_log: str = "server.log",
    env: dict[str, str] | None = None,
    server_memory_limit: int = 0,
    startup_timeout: float = 120.0,
) -> Run:
    if not namespaces_available():
        pytest.fail("running Triton's clients needs `unshare --net` (root) and iproute2")
    command = [
        "unshare",
        "--net",
        sys.executable,
        str(HERE / "netns_driver.py"),
        "--repository",
        str(repository),
        "--cwd",
        str(cwd),
    ]
    for argument in server_args:
        command.append(f"--server-arg={argument}")  # `=`: an argument may start with "--"
    for name, value in (client_env or {}).items():
        command.append(f"--client-env={name}={value}")
    command += ["--client-timeout", str(client_timeout), "--server-log", server_log]
    command += ["--server-memory-limit", str(server_memory_limit)]
    command += ["--startup-timeout", str(startup_timeout)]
    for client in clients:
        command += ["--client", client]
    env = {**os.environ, **(env or {})}  # the server's and the clients' environment
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p)
    env["PATH"] = env.get("PATH", "") + ":/usr/sbin:/sbin"  # `ip`, where a user's PATH lacks it
    done = subprocess.run(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout,
        cwd=cwd,
        env=env,
    )
    output = done.stdout.decode(errors="replace")
    marker = output.rfind("RESULTS ")
    if marker < 0:
        raise AssertionError(f"the namespace run ended without results:\n{output[-20000:]}")
    results = json.loads(output[marker + len("RESULTS ") :].splitlines()[0])
    return Run(output, results["clients"], results["server"], results["ready"])
