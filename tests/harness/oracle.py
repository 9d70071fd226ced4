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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .ports import LOCALHOST, free_ports
from .process import ServerProcess

ORACLE_PYTHON_ENV = "DYNAMO_BRIDGE_ORACLE_PYTHON"
DEFAULT_ORACLE_PYTHON = "/work/oracle/bin/python"

# Asks the oracle interpreter where pytriton lives without importing it (its import is slow).
_PROBE = (
    "import importlib.util, json, sys; "
    "spec = importlib.util.find_spec('pytriton'); "
    "print(json.dumps({'version': '%d.%d' % sys.version_info[:2], "
    "'package': list(spec.submodule_search_locations)[0] if spec else None}))"
)


# Triton 2.51 calls a Python stub unhealthy when the stub does not answer a message in time and
# the health lock is not taken within a second (python_backend's stub_launcher.cc). On this
# two-core machine, two test workers and a loaded oracle can starve a stub that long: twice in
# CI a stub the bridge never touches failed a request with this text. It is the oracle failing.
STARVED_STUB_TEXT = "' is not healthy."


def starved_stub(text: str) -> bool:
    """Whether real Triton's answer `text` is its starved-stub error."""
    return "Stub process '" in text and STARVED_STUB_TEXT in text


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


class TritonOracle(ServerProcess):
    """A real tritonserver on `model_repository`, on free loopback ports.

    Use as a context manager, or call start() / stop(). Extra command-line flags (e.g.
    "--model-control-mode=explicit", "--load-model=*", "--log-verbose=1") are passed through.
    `wait_for="ready"` waits for ServerReady (every model loaded); "live" only for ServerLive,
    for repositories where a model is expected to fail loading.
    """

    program = "tritonserver"
    log_name = "tritonserver.log"

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
        super().__init__(model_repository, extra_args, log_path, startup_timeout, env, cwd)
        self.wait_for = wait_for
        self.port_range = list(port_range) if port_range is not None else None
        self.http_port = 0

    @property
    def http_url(self) -> str:
        """host:port, as tritonclient.http.InferenceServerClient(url=...) expects."""
        return f"{LOCALHOST}:{self.http_port}"

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

    def environ(self) -> dict[str, str]:
        environ = oracle_environ(find_oracle())
        environ.update(self._extra_env)
        return environ

    def _pick_ports(self) -> None:
        self.grpc_port, self.http_port, self.metrics_port = free_ports(3, self.port_range)

    def start(self) -> TritonOracle:
        install_stub(find_oracle())
        return super().start()
