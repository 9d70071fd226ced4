"""The triton door as a process's frontend role (`--frontend triton`, roles `all` and `frontend`).

It has the shape of `FrontendRole` (frontend.py, Dynamo's door), so the composition root picks
one or the other and runs it the same way. Differences: no private HTTP port (the door has no
Dynamo HTTP server behind the metrics port), TLS files are read when the role is made (a bad
path fails start-up before any model loads), and at shutdown the door answers as tritonserver
does while it exits (bridge/frontends/triton/grpc/server.py `stop`) until the calls in flight
have finished, within `--exit-timeout-secs`; the HTTP server stops taking new calls meanwhile.
Both wires share one TritonService (bridge/frontends/triton/).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ..cluster.index import ClusterIndex
from ..frontends.triton.directory import Directory
from ..frontends.triton.grpc.server import DoorConfigError, GrpcServer, credentials
from ..frontends.triton.http.server import HttpConfigError, HttpServer, check_address
from ..frontends.triton.model_cards import ModelCards
from ..frontends.triton.service import TritonService
from ..options import ServerOptions, StartupError
from ..transport.shm_exchange import ShmDoor

log = logging.getLogger("dynamo_bridge")


class TritonDoorRole:
    """Serves Triton's gRPC and HTTP protocols for the models of the process's namespace."""

    http_port: int | None = None  # no Dynamo HTTP server to pass through

    def __init__(
        self,
        options: ServerOptions,
        local_worker: Callable[[str], Any | None] = lambda path: None,
        local_changes: Callable[[Callable[[str], None]], None] = lambda listener: None,
    ) -> None:
        self.options = options
        # endpoint path → this process's own ModelWorker serving it (the in-process route)
        self.local_worker = local_worker
        # Subscribes the directory to this process's own model changes (told at once; made
        # after the worker's manager: the composition root starts the worker first).
        self.local_changes = local_changes
        # Resolved whole by the command line (bridge/cli.py resolve_door); the composition root
        # makes this role only when there is a triton door.
        assert options.door is not None, "the triton door's role without its options"
        self.door_options = options.door
        try:
            credentials(self.door_options)
            if options.http is not None:
                check_address(options.http)
        except (DoorConfigError, HttpConfigError) as exc:
            raise StartupError(str(exc)) from None
        self.service: TritonService | None = None
        self.grpc: GrpcServer | None = None
        self.http: HttpServer | None = None
        self.task: asyncio.Future[None] | None = None
        self.shm: ShmDoor | None = None  # tensors to workers on this host (bridge/transport/)
        self._up = False
        self._stopping = False
        self._drain: asyncio.Future[Any] | None = None
        # Whether discovery works (the composition root's DiscoveryWatch, roles/discovery.py).
        self.discovery_usable: Callable[[], bool] = lambda: True

    def start(self, index: ClusterIndex) -> asyncio.Future[None]:
        """Start serving, reading the cluster through the process's one `index` (started and
        stopped by the composition root); the returned future ends when the door stops (or
        fails to start)."""
        cards = ModelCards(self.options.discovery_backend, self.options.namespace)
        self.shm = ShmDoor()
        directory = Directory(
            index,
            cards,
            self.local_worker,
            shm=self.shm,
            departed_grace=self.options.timings.departed_grace_secs,
        )
        self.local_changes(directory.changed)
        self.service = TritonService(
            directory,
            ready=self.ready,
            bytes_limits=self.options.bytes_limits,
            trace=self.options.trace,
            bridge_made=self.shm.made,
            strict_readiness=self.options.strict_readiness,
            allow_client_shm=self.options.allow_client_shm,
            max_shm_regions=self.options.max_shm_regions,
        )
        self.grpc = GrpcServer(self.service, self.door_options)
        if self.options.http is not None:
            self.http = HttpServer(self.service, self.options.http)
        self.task = asyncio.ensure_future(self._run(self.grpc, self.http))
        return self.task

    async def _run(self, grpc: GrpcServer, http: HttpServer | None) -> None:
        if self.shm is not None:
            self.shm.sweeper.start()
        try:
            await grpc.start()
            if http is not None:
                await http.start()
            self._up = True
            await grpc.wait()
            if http is not None:
                await http.wait()
        finally:
            if self.shm is not None:
                self.shm.close()
            if self.service is not None:
                self.service.close()

    def ready(self) -> bool:
        """The door's own readiness (ServerReady, /v2/health/ready on both ports): up, not
        stopping, and discovery works (etcd reachable, lease held)."""
        return (
            self._up
            and not self._stopping
            and self.task is not None
            and not self.task.done()
            and self.discovery_usable()
        )

    def stopping(self) -> None:
        """Shutdown began: refuse new calls, let the ones in flight finish (bounded)."""
        self._stopping = True
        stops = []
        if self.grpc is not None:
            stops.append(self.grpc.stop(grace=self.options.exit_timeout))
        if self.http is not None:
            stops.append(self.http.stop(grace=self.options.exit_timeout))
        if stops:
            self._drain = asyncio.ensure_future(asyncio.gather(*stops))

    async def drained(self, timeout: float) -> None:
        """Wait (at most `timeout` s) until the calls in flight at `stopping()` have finished:
        a process with no worker of its own must not end its runtime under them."""
        if self._drain is not None:
            await asyncio.wait({self._drain}, timeout=timeout)
