"""The triton door as a process's frontend role (`--frontend triton`, roles `all` and `frontend`).

It has the shape of bridge/roles/frontend.py's `FrontendRole`, so the composition root picks
one or the other and runs it the same way. Differences: no private HTTP port (the door has no
Dynamo HTTP server behind the metrics port), TLS files are read when the role is made (a bad
path fails start-up before any model loads), and at shutdown the gRPC server stops taking new
calls while the ones in flight finish, as tritonserver does, within `--exit-timeout-secs`.
"""

from __future__ import annotations

import asyncio
import logging

from dynamo.runtime import DistributedRuntime

from ...options import ServerOptions, StartupError
from .server import DoorConfigError, DoorOptions, TritonDoor, credentials

log = logging.getLogger("dynamo_bridge")


class TritonDoorRole:
    """Serves Triton's gRPC protocol for the models of the process's namespace."""

    http_port: int | None = None  # no Dynamo HTTP server to pass through

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        door = options.door or DoorOptions()
        self.door_options = DoorOptions(
            port=options.grpc_port,
            address=options.host,
            namespace=options.namespace,
            use_ssl=door.use_ssl,
            use_ssl_mutual=door.use_ssl_mutual,
            server_cert=door.server_cert,
            server_key=door.server_key,
            root_cert=door.root_cert,
            restricted=door.restricted,
        )
        try:
            credentials(self.door_options)
        except DoorConfigError as exc:
            raise StartupError(str(exc)) from None
        self.door: TritonDoor | None = None
        self.task: asyncio.Future[None] | None = None
        self._up = False
        self._stopping = False

    def start(self, runtime: DistributedRuntime) -> asyncio.Future[None]:
        """Start serving; the returned future ends when the door stops (or fails to start)."""
        self.door = TritonDoor(runtime, self.door_options, ready=self.ready)
        self.task = asyncio.ensure_future(self._run(self.door))
        return self.task

    async def _run(self, door: TritonDoor) -> None:
        await door.start()
        self._up = True
        await door.wait()

    def ready(self) -> bool:
        return self._up and not self._stopping and self.task is not None and not self.task.done()

    def stopping(self) -> None:
        """Shutdown began: refuse new calls, let the ones in flight finish (bounded)."""
        self._stopping = True
        if self.door is not None:
            asyncio.ensure_future(self.door.stop(grace=self.options.exit_timeout))
