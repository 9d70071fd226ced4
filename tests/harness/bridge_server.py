"""dynamo-bridge run as a subprocess, the way a user starts it."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from .ports import LOCALHOST, free_ports
from .process import ServerProcess

# The checkout holding bridge/ and model_repository_loader/: the subprocess imports them from
# here even when the project is not installed in the interpreter.
PROJECT_ROOT = Path(__file__).resolve().parents[2]


class BridgeServer(ServerProcess):
    """`python -m bridge --model-repository REPO --grpc-port P --metrics-port M *extra_args`.

    Use as a context manager, or call start() / stop(). start() returns once ServerLive answers
    on the gRPC port; stop() sends SIGTERM (SIGKILL after `stop_timeout`) and records the exit
    code in `returncode`. Output (stdout and stderr) goes to `log_path`; `log_text` reads it.

    The triton door's HTTP port (`http_port`, `http_url`) is given as DYN_BRIDGE_HTTP_PORT, so
    that it is free whatever the front door (Dynamo's frontend ignores it) and whatever runs
    as `module`; an `--http-port` among the extra arguments wins, as on the command line.
    """

    program = "dynamo-bridge"
    log_name = "bridge.log"
    # What `python -m` runs; the benchmarks' bare Dynamo echo worker takes the same flags.
    module = "bridge"

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
        super().__init__(model_repository, extra_args, log_path, startup_timeout, env, cwd)
        self.stop_timeout = stop_timeout
        self.http_port = 0

    @property
    def http_url(self) -> str:
        """host:port, as tritonclient.http.InferenceServerClient(url=...) expects."""
        return f"{LOCALHOST}:{self.http_port}"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            self.module,
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
        environ["DYN_BRIDGE_HTTP_PORT"] = str(self.http_port)
        environ.update(self._extra_env)
        return environ

    def _pick_ports(self) -> None:
        self.grpc_port, self.metrics_port, self.http_port = free_ports(3)
