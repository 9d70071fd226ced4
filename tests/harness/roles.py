"""dynamo-bridge in one role, as a subprocess: the one launcher of `--role worker` and
`--role frontend` for every test.

* `Worker`: `python -m bridge --role=worker --model-repository REPO --metrics-port M`. It has
  no gRPC port, so it is started once it says so on a port of its own, `ready_on`:
  - "metrics": its metrics port answers /v2/health/ready with 200 (Triton's strict readiness);
  - "listening": the metrics port answers at all (a worker whose start-up set failed is never
    ready, and still serves what loaded);
  - "system": Dynamo's system status server answers /health with 200 (the port, DYN_SYSTEM_PORT,
    is picked here); the bridge sets it only once every model of its start-up set is ready.
* `Frontend`: `python -m bridge --role=frontend --grpc-port P --metrics-port M`, no repository;
  started once ServerLive answers.

`role_flags` come before the test's own arguments (a Cluster's discovery backend, request plane
and namespace: tests/harness/cluster.py). Settings inherited from the test's environment that
would point a process at another test's cluster are dropped unless the test gives them.
Processes run in their own process group (process.py), so stopping one reaps the instance
processes it spawned and nothing else.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from typing import Any, Literal

from .bridge_server import BridgeServer
from .ports import LOCALHOST, free_port

# Where a worker's DYN_SYSTEM_PORT is picked: Dynamo 1.6.1 parses it as an i16, so a port above
# 32767 fails start-up (and below the kernel's ephemeral range, too).
SYSTEM_PORTS = range(20000, 32768)
# Inherited settings that would point a test's processes at someone else's cluster.
CLUSTER_VARIABLES = (
    "DYN_BRIDGE_ROLE",
    "DYN_DISCOVERY_BACKEND",
    "DYN_REQUEST_PLANE",
    "DYN_NAMESPACE",
    "DYN_FILE_KV",
    "ETCD_ENDPOINTS",
    "NATS_SERVER",
    "DYN_SYSTEM_PORT",
    "DYN_SYSTEM_HOST",
)
ReadyOn = Literal["metrics", "listening", "system"]


def http_status(url: str, timeout: float = 10.0) -> int | None:
    """The status of GET `url`, None while nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


class RoleProcess(BridgeServer):
    """A bridge process in one role; see Worker and Frontend."""

    role = "all"

    def __init__(
        self,
        model_repository: str | os.PathLike[str],
        *extra_args: str,
        name: str | None = None,
        role_flags: Iterable[str] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(model_repository, *extra_args, **kwargs)
        self.name = name or self.role
        self.role_flags = list(role_flags)
        self.program = f"dynamo-bridge --role {self.role} ({self.name})"
        self.started_at = 0.0  # time.monotonic() of the last start()

    def environ(self) -> dict[str, str]:
        environ = super().environ()
        for variable in CLUSTER_VARIABLES:
            if variable not in self._extra_env:
                environ.pop(variable, None)
        return environ

    def start(self) -> RoleProcess:
        self.started_at = time.monotonic()
        return super().start()

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} is not running"
        return self.process.pid

    def kill(self) -> int:
        """SIGKILL the bridge process alone, as a crash would; then reap what is left of its
        group (instance processes). Returns the exit code."""
        process = self.process
        assert process is not None, f"{self.name} is not running"
        process.send_signal(signal.SIGKILL)
        process.wait(30)
        self.stop(timeout=0)
        return process.returncode

    def terminate(self) -> None:
        """Send SIGTERM and return at once; `wait_exit` collects the exit code."""
        assert self.process is not None, f"{self.name} is not running"
        self.process.send_signal(signal.SIGTERM)

    def wait_exit(self, timeout: float = 60.0) -> int | None:
        """Wait for the process to exit on its own (after `terminate`), then reap its group."""
        assert self.process is not None
        self.process.wait(timeout)
        return self.stop(timeout=0)


class Worker(RoleProcess):
    """`--role=worker`: the models of `model_repository`, no gRPC port."""

    role = "worker"

    def __init__(
        self,
        model_repository: str | os.PathLike[str],
        *extra_args: str,
        ready_on: ReadyOn = "metrics",
        **kwargs: Any,
    ) -> None:
        super().__init__(model_repository, *extra_args, **kwargs)
        self.ready_on = ready_on
        self.system_port = 0
        self.ready_at = 0.0  # time.monotonic() when it was first found ready

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", self.module,
            "--role=worker",
            *self.role_flags,
            "--model-repository", str(self.model_repository),
            "--metrics-port", str(self.metrics_port),
            *self.extra_args,
        ]  # fmt: skip

    def _pick_ports(self) -> None:
        self.metrics_port = free_port()
        if self.ready_on == "system":
            self.system_port = free_port(SYSTEM_PORTS)
            self._extra_env["DYN_SYSTEM_PORT"] = str(self.system_port)
            self._extra_env["DYN_SYSTEM_HOST"] = LOCALHOST

    def health(self) -> int | None:
        """The status of GET /health on Dynamo's system status server (ready_on="system")."""
        return http_status(f"http://{LOCALHOST}:{self.system_port}/health")

    def _started(self) -> bool:
        if self.ready_on == "system":
            return self.health() == 200
        status = http_status(f"http://{LOCALHOST}:{self.metrics_port}/v2/health/ready")
        return status == 200 or (status is not None and self.ready_on == "listening")

    def _wait_started(self) -> None:
        self._wait_until(self._started, f"started ({self.ready_on})", poll=0.05)
        self.ready_at = time.monotonic()


class Frontend(RoleProcess):
    """`--role=frontend`: no repository; started once ServerLive answers."""

    role = "frontend"
    wait_for = "live"

    def __init__(self, *extra_args: str, **kwargs: Any) -> None:
        # A frontend has no repository; the path is never passed to it.
        super().__init__(".", *extra_args, **kwargs)

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", self.module,
            "--role=frontend",
            *self.role_flags,
            "--grpc-port", str(self.grpc_port),
            "--metrics-port", str(self.metrics_port),
            *self.extra_args,
        ]  # fmt: skip


__all__ = ["SYSTEM_PORTS", "Frontend", "RoleProcess", "Worker", "http_status"]
