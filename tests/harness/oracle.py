"""The real Triton server, run as a test oracle.

The oracle is the tritonserver binary (with its Python backend) shipped by the
`nvidia-pytriton` wheel, installed in a virtual environment of its own. It is never a product
dependency: tests use it to capture what real Triton answers, so expected texts and codes come
from Triton and not from our code.

The environment is found through the python of that venv: env var DYNAMO_BRIDGE_ORACLE_PYTHON,
else DEFAULT_ORACLE_PYTHON.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import tritonclient.grpc as grpcclient

from .ports import LOCALHOST, free_ports
from .process import stop_process_group

ORACLE_PYTHON_ENV = "DYNAMO_BRIDGE_ORACLE_PYTHON"
DEFAULT_ORACLE_PYTHON = "/work/oracle/bin/python"

# Asks the oracle interpreter where pytriton lives without importing it (its import is slow).
_PROBE = (
    "import importlib.util, json, sys; "
    "spec = importlib.util.find_spec('pytriton'); "
    "print(json.dumps({'version': '%d.%d' % sys.version_info[:2], "
    "'package': list(spec.submodule_search_locations)[0] if spec else None}))"
)


class OracleUnavailable(RuntimeError):
    """The oracle environment is missing or incomplete; the message says what is wrong."""


@dataclass(frozen=True)
class OracleEnv:
    """Paths of one oracle installation."""

    python: Path  # the venv's python, as given (not symlink-resolved: the venv is its parent)
    python_version: str  # "3.11": selects the matching python backend stub
    tritonserver: Path
    backends_dir: Path
    stub_source: Path
    libs_dir: Path

    @property
    def bin_dir(self) -> Path:
        return self.python.parent

    @property
    def stub_path(self) -> Path:
        return self.backends_dir / "python" / "triton_python_backend_stub"


def oracle_python() -> Path:
    """The python of the oracle venv (env var DYNAMO_BRIDGE_ORACLE_PYTHON or the default)."""
    return Path(os.environ.get(ORACLE_PYTHON_ENV) or DEFAULT_ORACLE_PYTHON).absolute()


@functools.lru_cache(maxsize=4)
def _find_oracle(python: Path) -> OracleEnv:
    hint = f"set {ORACLE_PYTHON_ENV} to the python of a venv with nvidia-pytriton installed"
    if not python.exists():
        raise OracleUnavailable(f"oracle python {python} does not exist; {hint}")
    try:
        probe = subprocess.run(
            [str(python), "-c", _PROBE], capture_output=True, text=True, timeout=60, check=True
        )
        info = json.loads(probe.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise OracleUnavailable(f"oracle python {python} cannot be run ({exc}); {hint}") from exc
    if not info.get("package"):
        raise OracleUnavailable(f"nvidia-pytriton is not installed for {python}; {hint}")
    package = Path(info["package"])
    server_dir = package / "tritonserver"
    env = OracleEnv(
        python=python,
        python_version=info["version"],
        tritonserver=server_dir / "bin" / "tritonserver",
        backends_dir=server_dir / "backends",
        stub_source=server_dir
        / "python_backend_stubs"
        / info["version"]
        / "triton_python_backend_stub",
        libs_dir=package.parent / "nvidia_pytriton.libs",
    )
    for required in (env.tritonserver, env.backends_dir / "python"):
        if not required.exists():
            raise OracleUnavailable(f"oracle installation is incomplete: {required} is missing")
    if not env.stub_path.exists() and not env.stub_source.exists():
        stubs = env.stub_source.parent.parent
        raise OracleUnavailable(
            f"no python backend stub for Python {env.python_version} in {stubs}"
        )
    return env


def find_oracle() -> OracleEnv:
    """Locate the oracle installation, or raise OracleUnavailable saying why not."""
    return _find_oracle(oracle_python())


def oracle_unavailable_reason() -> str | None:
    """None when the oracle can run here, else a one-line reason."""
    try:
        find_oracle()
    except OracleUnavailable as exc:
        return str(exc)
    return None


def in_ci() -> bool:
    """True when env CI says so (GitHub Actions, GitLab, ... set CI=true)."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes", "on"}


def require_oracle() -> None:
    """For tests that need the oracle: return if it can run, else fail in CI, skip elsewhere.

    In CI a missing oracle must not turn differential tests silently into skips.
    """
    import pytest

    reason = oracle_unavailable_reason()
    if reason is None:
        return
    message = f"the Triton oracle is unavailable: {reason}"
    if in_ci():
        pytest.fail(f"{message} (CI must run oracle tests)", pytrace=False)
    pytest.skip(message)


def install_stub(env: OracleEnv) -> None:
    """Put the stub built for the oracle's Python version into the python backend folder.

    The wheel ships one stub per Python version beside the backend; the backend only looks in
    its own folder. The copy is atomic because several test processes may start at once.
    """
    if env.stub_path.exists():
        return
    fd, tmp = tempfile.mkstemp(dir=env.stub_path.parent, prefix=".stub-")
    os.close(fd)
    try:
        shutil.copyfile(env.stub_source, tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, env.stub_path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def oracle_environ(env: OracleEnv, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Process environment for tritonserver: its bundled libraries, and the venv's bin first on
    PATH so the stub's interpreter finds the venv's numpy."""
    environ = dict(os.environ if base is None else base)
    libs = [str(env.libs_dir)] + [p for p in environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    environ["LD_LIBRARY_PATH"] = ":".join(libs)
    environ["PATH"] = os.pathsep.join([str(env.bin_dir), environ.get("PATH", os.defpath)])
    environ.pop("PYTHONPATH", None)  # our venv's packages must not leak into the stub
    environ.pop("PYTHONHOME", None)
    return environ


class TritonOracle:
    """A real tritonserver on `model_repository`, on free loopback ports.

    Use as a context manager, or call start() / stop(). Extra command-line flags (e.g.
    "--model-control-mode=explicit", "--load-model=*", "--log-verbose=1") are passed through.
    `wait_for="ready"` waits for ServerReady (every model loaded); "live" only for ServerLive,
    for repositories where a model is expected to fail loading.
    """

    def __init__(
        self,
        model_repository: str | os.PathLike[str],
        *extra_args: str,
        log_path: str | os.PathLike[str] | None = None,
        wait_for: Literal["ready", "live"] = "ready",
        startup_timeout: float = 120.0,
        port_range: Iterable[int] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> None:
        self.model_repository = Path(model_repository).absolute()
        self.extra_args = list(extra_args)
        self.wait_for = wait_for
        self.startup_timeout = startup_timeout
        self.port_range = list(port_range) if port_range is not None else None
        self._extra_env = dict(env or {})
        self.cwd = Path(cwd) if cwd is not None else None
        if log_path is None:
            log_path = Path(tempfile.mkdtemp(prefix="triton-oracle-")) / "tritonserver.log"
        self.log_path = Path(log_path)
        self.grpc_port = self.http_port = self.metrics_port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None
        self._client = None

    # -- addresses -------------------------------------------------------------------------

    @property
    def grpc_url(self) -> str:
        """host:port, as tritonclient.grpc.InferenceServerClient(url=...) expects."""
        return f"{LOCALHOST}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        """host:port, as tritonclient.http.InferenceServerClient(url=...) expects."""
        return f"{LOCALHOST}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{LOCALHOST}:{self.metrics_port}/metrics"

    # -- lifecycle -------------------------------------------------------------------------

    def command(self) -> list[str]:
        env = find_oracle()
        return [
            str(env.tritonserver),
            f"--backend-directory={env.backends_dir}",
            f"--model-repository={self.model_repository}",
            f"--grpc-address={LOCALHOST}",
            f"--grpc-port={self.grpc_port}",
            f"--http-address={LOCALHOST}",
            f"--http-port={self.http_port}",
            f"--metrics-address={LOCALHOST}",
            f"--metrics-port={self.metrics_port}",
            "--exit-timeout-secs=5",
            *self.extra_args,
        ]

    def start(self) -> TritonOracle:
        env = find_oracle()
        install_stub(env)
        environ = oracle_environ(env)
        environ.update(self._extra_env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # A port picked as free can be taken before the server binds it; retry with new ports.
        for attempt in range(3):
            self.grpc_port, self.http_port, self.metrics_port = free_ports(3, self.port_range)
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(
                    self.command(),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=environ,
                    cwd=self.cwd,
                    # Own process group: stop() can reap the stub processes it spawned too.
                    start_new_session=True,
                )
            try:
                self._wait_started()
                return self
            except RuntimeError:
                self.stop()
                if attempt < 2 and "already in use" in self.log_text:
                    continue
                raise
        raise AssertionError("unreachable")

    def _wait_started(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout
        client = grpcclient.InferenceServerClient(self.grpc_url)
        try:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"tritonserver exited with code {self.process.returncode} during start-up; "
                        f"log {self.log_path}:\n{self.log_tail()}"
                    )
                try:
                    if self.wait_for == "live":
                        if client.is_server_live():
                            return
                    elif client.is_server_ready():
                        return
                except Exception:  # not listening yet
                    pass
                if time.monotonic() >= deadline:
                    raise RuntimeError(
                        f"tritonserver not {self.wait_for} after {self.startup_timeout:.0f} s; "
                        f"log {self.log_path}:\n{self.log_tail()}"
                    )
                time.sleep(0.1)
        finally:
            client.close()

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after `timeout` s.

        Returns the exit code, also kept in `returncode` (None if never started)."""
        if self._client is not None:
            self._client.close()
            self._client = None
        proc = self.process
        if proc is None:
            return self.returncode
        stop_process_group(proc, timeout)
        self.returncode = proc.returncode
        self.process = None
        return self.returncode

    def __enter__(self) -> TritonOracle:
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
        while not self.client().is_model_ready(model_name, version):
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
