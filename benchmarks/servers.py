"""The servers under test, each a subprocess on its own loopback ports.

* triton: the real tritonserver from nvidia-pytriton (the test oracle's environment).
* bridge: `python -m bridge --frontend dynamo`, the product behind Dynamo's KServe frontend (the
  default before the triton door became it; the comparison with `echo` is Dynamo's door's).
* bridge2: a second, identical bridge process: the A/A pair of `bridge`, whose ratio to it is
  the run's noise floor.
* echo: `python -m benchmarks.echo_worker`, bare Dynamo with the bridge's codec: the floor.
* door: `python -m bridge --frontend triton`, the bridge's own Triton front door, embedded (one
  process: the door calls its worker in-process).
* door_split: `python -m bridge --role frontend --frontend triton` and one `--role worker`
  process, over file discovery and the tcp request plane (issue 13's second column).
* floor_aio, floor_aio_hop, floor_sync, floor_sync_hop: `python -m benchmarks.grpc_floor`, bare
  gRPC servers that answer ModelInfer with numpy alone (grpc_floor.py says what each kind is).
* door_sync: `python -m benchmarks.door_sync`, a LAB server: the
  door's unary conversions and the real loader on a synchronous grpc.server (door_sync.py says
  what it leaves out).

They are started with the test harness (tests/harness), which finds free ports, waits until a
server answers, and stops its whole process group. A server that cannot start is reported as
unavailable with the reason; the benchmark goes on without it.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from benchmarks.placement import Placement
from tests.harness.bridge_server import BridgeServer
from tests.harness.cluster import Cluster
from tests.harness.oracle import TritonOracle, oracle_unavailable_reason
from tests.harness.roles import Frontend

FLOORS: tuple[str, ...] = ("floor_aio", "floor_aio_hop", "floor_sync", "floor_sync_hop")
SERVER_NAMES: tuple[str, ...] = (
    "triton",
    "bridge",
    "bridge2",
    "echo",
    "door",
    "door_split",
    *FLOORS,
    "door_sync",
)
# Started when --servers is not given: door_split (two more processes) only on request.
DEFAULT_SERVERS: tuple[str, ...] = ("triton", "bridge", "bridge2", "echo", "door")
DOOR = ("--frontend", "triton")
DYNAMO_DOOR = ("--frontend", "dynamo")
_STARTUP_TIMEOUT = 120.0


class _Server(Protocol):
    grpc_url: str

    def start(self) -> object: ...

    def stop(self) -> object: ...

    def wait_model_ready(
        self, model_name: str, version: str = "", timeout: float = 60.0
    ) -> None: ...

    def client(self) -> Any: ...  # a tritonclient.grpc.InferenceServerClient


class EchoServer(BridgeServer):
    """The bare Dynamo echo worker, started and stopped exactly like the bridge."""

    module = "benchmarks.echo_worker"


class FloorServer(BridgeServer):
    """A bare gRPC server of benchmarks/grpc_floor.py, started and stopped like the bridge."""

    module = "benchmarks.grpc_floor"


class SyncDoorServer(BridgeServer):
    """The lab door of benchmarks/door_sync.py, started and stopped like the bridge."""

    module = "benchmarks.door_sync"


class SplitDoor:
    """`--role frontend --frontend triton` in front of one `--role worker` process, over file
    discovery and the tcp request plane on 127.0.0.1 (tests/harness/cluster.py)."""

    def __init__(self, repository: Path, log_path: Path) -> None:
        self._workdir = tempfile.TemporaryDirectory(prefix="door-split-")
        cluster = Cluster(Path(self._workdir.name))
        cluster.workdir = log_path.parent  # the processes' logs beside the other servers'
        self.cluster = cluster
        self.worker = cluster.worker(
            repository, name=f"{log_path.stem}-worker", startup_timeout=_STARTUP_TIMEOUT
        )
        self.frontend: Frontend = cluster.frontend(
            *DOOR, name=f"{log_path.stem}-frontend", startup_timeout=_STARTUP_TIMEOUT
        )

    @property
    def grpc_url(self) -> str:
        return self.frontend.grpc_url

    def start(self) -> SplitDoor:
        self.worker.start()
        self.frontend.start()
        return self

    def stop(self) -> None:
        self.cluster.stop()
        self._workdir.cleanup()

    def wait_model_ready(self, model_name: str, version: str = "", timeout: float = 60.0) -> None:
        self.frontend.wait_model_ready(model_name, version, timeout)

    def client(self) -> Any:
        return self.frontend.client()


@dataclass
class Target:
    """One server of the run: running (`server` set) or unavailable (`reason` says why)."""

    name: str
    server: _Server | None = None
    reason: str = ""
    log_path: Path | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.grpc_url


def _create(name: str, repository: Path, log_path: Path) -> _Server:
    if name == "triton":
        reason = oracle_unavailable_reason()
        if reason is not None:
            raise RuntimeError(reason)
        return TritonOracle(repository, log_path=log_path, startup_timeout=_STARTUP_TIMEOUT)
    if name in ("bridge", "bridge2"):
        return BridgeServer(
            repository, *DYNAMO_DOOR, log_path=log_path, startup_timeout=_STARTUP_TIMEOUT
        )
    if name == "echo":
        return EchoServer(repository, log_path=log_path, startup_timeout=_STARTUP_TIMEOUT)
    if name == "door":
        return BridgeServer(repository, *DOOR, log_path=log_path, startup_timeout=_STARTUP_TIMEOUT)
    if name == "door_split":
        return SplitDoor(repository, log_path)
    if name in FLOORS:
        kind = name.removeprefix("floor_")
        return FloorServer(
            repository, "--kind", kind, log_path=log_path, startup_timeout=_STARTUP_TIMEOUT
        )
    if name == "door_sync":
        return SyncDoorServer(repository, log_path=log_path, startup_timeout=_STARTUP_TIMEOUT)
    raise ValueError(f"unknown server '{name}'; known: {', '.join(SERVER_NAMES)}")


def _start(target: Target, repository: Path, models: Sequence[str]) -> None:
    assert target.log_path is not None
    try:
        server = _create(target.name, repository, target.log_path)
    except Exception as exc:
        target.reason = str(exc)
        return
    # Set before starting, so stop_targets() reaches a server still starting (e.g. on Ctrl-C).
    target.server = server
    try:
        server.start()
        for model in models:
            server.wait_model_ready(model, timeout=_STARTUP_TIMEOUT)
    except Exception as exc:
        target.server = None
        server.stop()
        first_line = (str(exc).splitlines() or [""])[0]
        target.reason = f"{type(exc).__name__}: {first_line} (log {target.log_path})"


def make_targets(names: Sequence[str], log_dir: Path) -> list[Target]:
    """One not yet started Target per server name, logging to `log_dir/<name>.log`."""
    log_dir.mkdir(parents=True, exist_ok=True)
    return [Target(name, log_path=log_dir / f"{name}.log") for name in names]


def start_targets(
    targets: Sequence[Target],
    repository: Path,
    models: Sequence[str],
    placement: Placement | None = None,
) -> None:
    """Start the servers on `repository`, all at once, and wait until `models` are ready.

    With a `placement`, the servers start on its server CPUs and this process's threads are
    then pinned to its client CPUs (benchmarks/placement.py). Afterwards each target has
    `server` (running) or `reason` (why not). Call stop_targets() in any case, also when this
    is interrupted.
    """
    if placement is not None:
        placement.pin_server_side()
    threads = [
        threading.Thread(target=_start, args=(t, repository, models), daemon=True) for t in targets
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if placement is not None:
        placement.pin_client()


def stop_targets(targets: Sequence[Target]) -> None:
    for target in targets:
        if target.server is not None:
            target.server.stop()
            target.server = None
