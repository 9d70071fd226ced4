"""The frontend side of a bridge process: Dynamo's KServe gRPC frontend on `--grpc-port`.

It serves the models it finds through discovery in the bridge's namespace, whichever process
serves them (this one with `--role all`, workers elsewhere with `--role frontend`). Its own HTTP
server (`/metrics` with `dynamo_frontend_*`, `/health`, `/live`, `/v1/models`, `/docs`,
`/openapi.json`) runs on a port the bridge picks; the bridge's metrics port serves its `/metrics`
and passes its `GET /health` and `/live` through (bridge/metrics/server.py).

Where those ports listen: Dynamo 1.6.1 binds both the gRPC port and that HTTP port on every
interface (0.0.0.0) whatever `--host` says. The gRPC entry point builds its HTTP server with
the builder's default host and takes no host for it (lib/llm/src/grpc/service/kserve.rs,
`http_metrics_host`), and no environment variable sets it (the wheel's DYN_* names were
searched). So the bridge says so at start-up, every time, with both port numbers, and turns
off what a stranger could change there: Dynamo's admin API (`GET`/`POST /busy_threshold`), with
Dynamo's own switch DYN_DISABLE_FRONTEND_ADMIN_API (unless the operator set it).

Readiness of a frontend-only process (`/v2/health/ready` on the metrics port): ready once the
gRPC port accepts connections, until shutdown begins, and while discovery works
(roles/discovery.py). Models come and go with their workers, so a
frontend does not wait for any; ModelReady answers per model.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

from dynamo.runtime import DistributedRuntime

from ..frontends.dynamo import run_grpc_frontend
from ..metrics.server import free_loopback_port
from ..options import ServerOptions
from .frontend_probe import until_frontend_lists

log = logging.getLogger("dynamo_bridge")

GRPC_PROBE_S = 0.05  # between connection attempts while the gRPC port comes up
# How long a newly registered model may take to be listed before a reload goes on anyway (and
# says so): measured listings come within milliseconds; this only bounds a frontend that hangs.
LISTING_TIMEOUT_S = 5.0
# Dynamo's switch for its HTTP admin API (`/busy_threshold`), read when the frontend starts.
ADMIN_API_SWITCH = "DYN_DISABLE_FRONTEND_ADMIN_API"

# Once at start-up: what a Triton user may look for here in vain (most of Triton's own example
# clients use tritonclient.http on port 8000), and where it is served.
DYNAMO_DOOR_NOTICE = (
    "--frontend dynamo: Dynamo's KServe frontend serves gRPC only; it has no HTTP/REST port "
    "(8000, --http-port), no repository (index, load, unload), statistics, server metadata, "
    "logging, trace or shared-memory RPCs, and answers some calls differently "
    "(docs/frontend_differences.md); --frontend triton (the default) serves all of them"
)


class FrontendRole:
    """Runs Dynamo's KServe gRPC frontend on a runtime until the runtime shuts down."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        # Dynamo's frontend insists on serving an HTTP port of its own (on 0.0.0.0, above).
        self.http_port = free_loopback_port()
        os.environ.setdefault(ADMIN_API_SWITCH, "1")
        self.task: asyncio.Future[None] | None = None
        self._up = False
        self._stopping = False
        # Whether discovery works (the composition root's DiscoveryWatch, roles/discovery.py).
        self.discovery_usable: Callable[[], bool] = lambda: True

    def start(self, runtime: DistributedRuntime) -> asyncio.Future[None]:
        """Start serving; the returned future ends when the frontend stops (or fails)."""
        options = self.options
        self.task = asyncio.ensure_future(
            run_grpc_frontend(
                runtime, options.grpc_port, self.http_port, options.host, options.namespace
            )
        )
        asyncio.ensure_future(self._until_up())
        # Dynamo 1.6's KServe frontend listens on every interface whatever `http_host` says
        # (seen with `ss -ltnp`), its own HTTP port too (module docstring). Say where: a WARN
        # when that is not what --host asked for, else once at INFO (a healthy start has no
        # WARN line; the HTTP port on every interface is said all the same).
        all_interfaces = options.host in ("0.0.0.0", "::")
        log.log(
            logging.INFO if all_interfaces else logging.WARNING,
            "%sDynamo's KServe frontend binds gRPC (port %d) and its own HTTP port (%d: "
            "/metrics, /health, /live, /v1/models, /docs, /openapi.json) on every interface "
            "(0.0.0.0), and Dynamo 1.6 has no setting for their address: both are reachable "
            "from other hosts; restrict them with a firewall or a network namespace, or use "
            "--frontend triton",
            "" if all_interfaces else f"--host {options.host} is not honoured: ",
            options.grpc_port,
            self.http_port,
        )
        if os.environ.get(ADMIN_API_SWITCH, "").strip().lower() not in ("1", "true", "yes", "on"):
            log.warning(
                "%s is off: Dynamo's admin API (POST /busy_threshold) is served on 0.0.0.0:%d",
                ADMIN_API_SWITCH,
                self.http_port,
            )
        log.info("serving KServe gRPC on 0.0.0.0:%d (all interfaces)", options.grpc_port)
        log.info("Dynamo's frontend HTTP on 0.0.0.0:%d (all interfaces)", self.http_port)
        log.info(DYNAMO_DOOR_NOTICE)
        return self.task

    async def confirm_listed(self, name: str) -> None:
        """Return once this frontend lists `name` (its `/v1/models`), so that "load returned"
        means "requests reach it", as in Triton, and a reload withdraws the old generation
        only then; at most LISTING_TIMEOUT_S (logged)."""
        if not await until_frontend_lists(self.http_port, name, LISTING_TIMEOUT_S):
            log.warning(
                "'%s' registered but not listed by the frontend after %.0fs",
                name,
                LISTING_TIMEOUT_S,
            )

    def ready(self) -> bool:
        return (
            self._up
            and not self._stopping
            and self.task is not None
            and not self.task.done()
            and self.discovery_usable()
        )

    def stopping(self) -> None:
        self._stopping = True

    async def drained(self, timeout: float) -> None:
        """Nothing to wait for: Dynamo's frontend has no draining state (the workers drain)."""

    async def _until_up(self) -> None:
        while self.task is not None and not self.task.done():
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.options.grpc_port)
            except OSError:
                await asyncio.sleep(GRPC_PROBE_S)
                continue
            writer.close()
            self._up = True
            return
