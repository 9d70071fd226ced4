"""dynamo-bridge run as a subprocess, the way a user starts it."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import tritonclient.grpc as grpcclient

from .ports import LOCALHOST, free_ports
from .process import stop_process_group

# The checkout holding bridge/ and model_repository_loader/: the subprocess imports them from
# here even when the project is not installed in the interpreter.
PROJECT_ROOT = Path(__file__).resolve().parents[2]


class BridgeServer:
    """`python -m bridge --model-repository REPO --grpc-port P --metrics-port M *extra_args`.

    Use as a context manager, or call start() / stop(). start() returns once ServerLive answers
    on the gRPC port; stop() sends SIGTERM (SIGKILL after `stop_timeout`) and records the exit
    code in `returncode`. Output (stdout and stderr) goes to `log_path`; `log_text` reads it.
    """

    def __init__(
        self,
        model_repository: str | os.PathLike[str],
        *extra_args: str,
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 60.0,
        stop_timeout: float = 15.0,
        log_path: str | os.PathLike[str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> None:
        self.model_repository = Path(model_repository).absolute()
        self.extra_args = [str(arg) for arg in extra_args]
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self._extra_env = dict(env or {})
        self.cwd = Path(cwd) if cwd is not None else None
        if log_path is None:
            log_path = Path(tempfile.mkdtemp(prefix="dynamo-bridge-")) / "bridge.log"
        self.log_path = Path(log_path)
        self.grpc_port = self.metrics_port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None
        self._client: grpcclient.InferenceServerClient | None = None

    @property
    def grpc_url(self) -> str:
        """host:port, as tritonclient.grpc.InferenceServerClient(url=...) expects."""
        return f"{LOCALHOST}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{LOCALHOST}:{self.metrics_port}/metrics"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "bridge",
            "--model-repository",
            str(self.model_repository),
            "--grpc-port",
            str(self.grpc_port),
            "--metrics-port",
            str(self.metrics_port),
            *self.extra_args,
        ]

    def environ(self) -> dict[str, str]:
        environ = dict(os.environ)
        environ["DYN_LOG"] = "warn"
        path = [str(PROJECT_ROOT)] + [p for p in environ.get("PYTHONPATH", "").split(":") if p]
        environ["PYTHONPATH"] = os.pathsep.join(path)
        environ.update(self._extra_env)
        return environ

    def start(self) -> BridgeServer:
        self.grpc_port, self.metrics_port = free_ports(2)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.environ(),
                cwd=self.cwd,
                # Own process group: stop() can reap the worker processes it spawned too.
                start_new_session=True,
            )
        try:
            self._wait_live()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_live(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout
        client = grpcclient.InferenceServerClient(self.grpc_url)
        try:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"dynamo-bridge exited with code {self.process.returncode} during "
                        f"start-up; log {self.log_path}:\n{self.log_tail()}"
                    )
                try:
                    if client.is_server_live():
                        return
                except Exception:  # not listening yet
                    pass
                if time.monotonic() >= deadline:
                    raise RuntimeError(
                        f"dynamo-bridge not live after {self.startup_timeout:.0f} s; "
                        f"log {self.log_path}:\n{self.log_tail()}"
                    )
                time.sleep(0.1)
        finally:
            client.close()

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM, then SIGKILL after the timeout (default `stop_timeout`).

        Returns the exit code, also kept in `returncode` (None if never started)."""
        if self._client is not None:
            self._client.close()
            self._client = None
        proc = self.process
        if proc is None:
            return self.returncode
        stop_process_group(proc, self.stop_timeout if timeout is None else timeout)
        self.returncode = proc.returncode
        self.process = None
        return self.returncode

    def __enter__(self) -> BridgeServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def client(self) -> grpcclient.InferenceServerClient:
        """A gRPC client for this server, shared and closed on stop()."""
        if self._client is None:
            self._client = grpcclient.InferenceServerClient(self.grpc_url)
        return self._client

    def wait_model_ready(self, model_name: str, version: str = "", timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.client().is_model_ready(model_name, version):
                    return
            except Exception:  # the frontend may not know the model yet
                pass
            if time.monotonic() >= deadline:
                raise TimeoutError(f"model {model_name!r} not ready after {timeout:.0f} s")
            time.sleep(0.1)

    @property
    def log_text(self) -> str:
        """Everything the bridge wrote to stdout/stderr so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text.splitlines()[-lines:])
