"""`--control-port`: Triton's model repository API (and health) on 127.0.0.1, for any front door.

It is the triton door's HTTP wire (bridge/frontends/triton/http/) with the control routes only:
`POST /v2/repository/index`, `/v2/repository/models/<m>/load|unload`, `GET /v2/health/live|ready`,
over a `TritonService` of its own that reaches the workers of the namespace through their
control endpoints (docs/worker_protocol.md §1). So it works the same beside Dynamo's KServe
frontend (`--frontend dynamo`, which has no repository RPCs) and beside the triton door, and a
load reaches whichever worker knows the model. The workers apply their `--model-control-mode`
(load/unload in explicit mode only) and answer with Triton's texts and codes.

Loading runs code, so every request here is guarded as http/security.py says: loopback only,
refused from web pages (Origin / Host), JSON bodies only, bodies up to `--http-max-input-size`
(Triton's 64 MB by default, whatever the front door) received in bounded time, and
the `--http-restricted-api` groups (`model-repository`, `health`); and every connection as
http/connections.py says (head and body deadlines, keep-alive, a cap).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from ..cluster.index import ClusterIndex
from ..frontends.triton.directory import Directory
from ..frontends.triton.http.connections import ConnectionLimits
from ..frontends.triton.http.limits import DEFAULT_MAX_INPUT_SIZE
from ..frontends.triton.http.server import HttpOptions, HttpServer
from ..frontends.triton.service import TritonService
from ..restrictions import Restriction

log = logging.getLogger("dynamo_bridge")

ADDRESS = "127.0.0.1"  # loading code is not something to expose


class ControlPort:
    """The control routes of the HTTP wire on `ADDRESS:port`."""

    def __init__(
        self,
        index: ClusterIndex,
        port: int,
        restricted: Mapping[str, Restriction],
        limits: ConnectionLimits,
        ready: Callable[[], bool] = lambda: True,
        max_input_size: int = DEFAULT_MAX_INPUT_SIZE,
        strict_readiness: bool = True,
    ) -> None:
        # The process's one ClusterIndex (the composition root starts and stops it).
        self._directory = Directory(index)
        # `ready`: the process's own readiness (discovery works), on top of the models' (unless
        # --strict-readiness false).
        self._service = TritonService(
            self._directory, ready=ready, strict_readiness=strict_readiness
        )
        options = HttpOptions(
            port=port,
            address=ADDRESS,
            restricted=dict(restricted),
            control=True,
            limits=limits,
            max_input_size=max_input_size,
        )
        self._http = HttpServer(self._service, options)

    @property
    def port(self) -> int:
        return self._http.port

    async def start(self) -> None:
        await self._http.start()
        log.info("model control (repository API) on http://%s:%d", ADDRESS, self.port)

    async def stop(self, grace: float = 1.0) -> None:
        """Stop listening; requests being handled get `grace` seconds to finish."""
        await self._http.stop(grace)
        self._service.close()
