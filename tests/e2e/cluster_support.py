"""Several bridge processes on one host, and a caller with its own Dynamo runtime.

Each test gets its own file-discovery folder (`DYN_FILE_KV`), so processes of other tests never
see its models. Every bridge runs the embedded default (its own Dynamo frontend), with `file`
discovery through `DYN_DISCOVERY_BACKEND`.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.harness.bridge_server import PROJECT_ROOT, BridgeServer

NAMESPACE = "dynamo_bridge"  # the bridge's default namespace


def file_discovery_env(folder: Path) -> dict[str, str]:
    """What every process of one test needs to find the others: Dynamo's own variables."""
    folder.mkdir(parents=True, exist_ok=True)
    return {
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_REQUEST_PLANE": "tcp",
        "DYN_FILE_KV": str(folder),
        "DYN_TCP_RPC_HOST": "127.0.0.1",
        "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
    }


def start_bridge(repo: Path, env: dict[str, str], log: Path, *args: str) -> BridgeServer:
    server = BridgeServer(repo, *args, env=env, log_path=log)
    server.start()
    return server


class DynamoCaller:
    """tests/e2e/dynamo_caller.py in a subprocess: a process of its own with its own runtime."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        environ = dict(os.environ)
        environ.update(env)
        environ["DYN_LOG"] = "warn"
        environ["PYTHONPATH"] = os.pathsep.join(
            [str(PROJECT_ROOT)] + [p for p in environ.get("PYTHONPATH", "").split(":") if p]
        )
        self._log = open(log, "wb")  # noqa: SIM115 - closed in close()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.dynamo_caller"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=environ,
            cwd=PROJECT_ROOT,
            start_new_session=True,
        )

    def _ask(self, *command: Any) -> Any:
        assert self._process.stdin is not None and self._process.stdout is not None
        pickle.dump(command, self._process.stdin)
        self._process.stdin.flush()
        ok, value = pickle.load(self._process.stdout)
        if not ok:
            raise AssertionError(f"caller: {command[0]} failed: {value}")
        return value

    def control(self, request: dict[str, Any], count: int = 1) -> dict[int, list]:
        return self._ask("control", NAMESPACE, request, count)

    def call(self, path: str, request: dict[str, Any]) -> list[dict[str, Any]]:
        return self._ask("call", path, request)

    def call_cancel(self, path: str, request: dict[str, Any], after: int) -> list[dict[str, Any]]:
        return self._ask("call_cancel", path, request, after)

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(15)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._log.close()
