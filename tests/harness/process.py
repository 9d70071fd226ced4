"""A server subprocess in its own process group: start, wait until it answers, stop."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Literal, TypeVar

import tritonclient.grpc as grpcclient

from .ports import LOCALHOST
from .sockets import listening

_Server = TypeVar("_Server", bound="ServerProcess")


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # nothing left in the group


def group_listens_on(pgid: int, port: int) -> bool:
    """Does a process of group `pgid` hold the socket listening on `port`? (A port picked as
    free can be taken by another test's server before ours binds it: that server would answer
    our health checks.)"""
    wanted = {f"socket:[{inode}]" for _, inode in listening(port)}
    if not wanted:
        return False
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getpgid(int(pid)) != pgid:
                continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                    return True
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return False


def stop_process_group(process: subprocess.Popen, timeout: float) -> int:
    """SIGTERM the server, SIGKILL its whole group after `timeout` s; returns the exit code.

    The server must have been started with `start_new_session=True`, so its group holds only it
    and the processes it spawned (Triton's python stubs, the bridge's instance workers). Those
    are killed as well once the server is gone, so a killed server leaves no orphans behind.
    """
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process.pid)
            process.wait()
    _kill_group(process.pid)
    return process.returncode


class ServerProcess:
    """A KServe gRPC server on `model_repository`, run as a subprocess on free loopback ports.

    Use as a context manager, or call start() / stop(). start() returns once the server answers
    ServerLive or ServerReady (`wait_for`); stop() sends SIGTERM (SIGKILL after `stop_timeout`)
    and records the exit code in `returncode`. Output (stdout and stderr) goes to `log_path`;
    `log_text` reads it.

    Subclasses say how to run the server: command(), environ() and _pick_ports(); `program`
    names it in messages.
    """

    program = "server"
    log_name = "server.log"
    wait_for: Literal["ready", "live"] = "live"
    stop_timeout = 15.0

    def __init__(
        self,
        model_repository: str | os.PathLike[str],
        extra_args: Iterable[str],
        log_path: str | os.PathLike[str] | None,
        startup_timeout: float,
        env: Mapping[str, str] | None,
        cwd: str | os.PathLike[str] | None,
    ) -> None:
        self.model_repository = Path(model_repository).absolute()
        self.extra_args = [str(arg) for arg in extra_args]
        self.startup_timeout = startup_timeout
        self._extra_env = dict(env or {})
        self.cwd = Path(cwd) if cwd is not None else None
        if log_path is None:
            log_path = Path(tempfile.mkdtemp(prefix=f"{self.program}-")) / self.log_name
        self.log_path = Path(log_path)
        self.grpc_port = self.metrics_port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None
        self._client: grpcclient.InferenceServerClient | None = None

    # -- what subclasses provide -----------------------------------------------------------

    def command(self) -> list[str]:
        raise NotImplementedError

    def environ(self) -> dict[str, str]:
        raise NotImplementedError

    def _pick_ports(self) -> None:
        """Set grpc_port, metrics_port (and any other port the server listens on)."""
        raise NotImplementedError

    # -- addresses -------------------------------------------------------------------------

    @property
    def grpc_url(self) -> str:
        """host:port, as tritonclient.grpc.InferenceServerClient(url=...) expects."""
        return f"{LOCALHOST}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{LOCALHOST}:{self.metrics_port}/metrics"

    # -- lifecycle -------------------------------------------------------------------------

    def start(self: _Server) -> _Server:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # A port picked as free can be taken before the server binds it; retry with new ports.
        for attempt in range(3):
            self._pick_ports()
            environ = self.environ()  # after the ports: it may name one
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(
                    self.command(),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=environ,
                    cwd=self.cwd,
                    # Own process group: stop() can reap the processes it spawned too.
                    start_new_session=True,
                )
            try:
                self._wait_started()
                return self
            except BaseException as exc:
                self.stop()
                # The bridge says `--grpc-port N is in use`; other servers `already in use`.
                port_taken = isinstance(exc, RuntimeError) and "in use" in self.log_text
                if port_taken and attempt < 2:
                    continue
                raise
        raise AssertionError("unreachable")

    def _wait_started(self) -> None:
        client = grpcclient.InferenceServerClient(self.grpc_url)

        def answers() -> bool:
            try:
                if self.wait_for == "live":
                    up = bool(client.is_server_live())
                else:
                    up = bool(client.is_server_ready())
            except Exception:  # not listening yet
                return False
            assert self.process is not None  # and the server answering is ours:
            return up and group_listens_on(self.process.pid, self.grpc_port)

        try:
            self._wait_until(answers, self.wait_for, poll=0.1)
        finally:
            client.close()

    def _wait_until(self, started: Callable[[], bool], what: str, poll: float) -> None:
        """Poll `started()` until true; RuntimeError (with the log's tail) if the process exits
        first or `startup_timeout` passes."""
        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.program} exited with code {self.process.returncode} during "
                    f"start-up; log {self.log_path}:\n{self.log_tail()}"
                )
            if started():
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"{self.program} not {what} after {self.startup_timeout:.0f} s; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(poll)

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

    def __enter__(self: _Server) -> _Server:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # -- helpers for tests -----------------------------------------------------------------

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
            except Exception:  # the server may not know the model yet
                pass
            if time.monotonic() >= deadline:
                raise TimeoutError(f"model {model_name!r} not ready after {timeout:.0f} s")
            time.sleep(0.1)

    @property
    def log_text(self) -> str:
        """Everything the server wrote to stdout/stderr so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text.splitlines()[-lines:])
