"""The metrics port: one scrape target for Triton's metrics, custom metrics and Dynamo's own.

Dynamo's KServe frontend insists on serving its own HTTP port (`/metrics` with the
`dynamo_frontend_*` families, `/health`, `/live`, `/v1/models`, ...), and a callback registered
with `register_prometheus_expfmt_callback` does not reach that `/metrics` (spec dynamo_runtime.md
§8). So the bridge runs the frontend's port on a private loopback port and serves the public
`--metrics-port` itself:

* `GET /metrics`: every source's text (Triton's `nv_inference_*`, the models' custom families),
  then the frontend's own `/metrics`, fetched at each scrape;
* `GET /v2/health/live` and `GET /v2/health/ready`: Triton's HTTP health paths, with Triton's
  answers (200, or 400 when not ready; empty text/plain bodies [V on 2.51]). Readiness is strict,
  as Triton's default: every model the server tried to load is ready (the `ready` callable); one
  that failed, or was unloaded since, makes the server not ready, as in Triton 2.51.
  Dynamo's frontend answers these paths 404, and its gRPC ServerReady says true regardless;
  this is the honest answer for health checks that cannot ask ModelReady per model;
* anything else: passed through to the frontend unchanged (`/health`, `/live`, ...).

aiohttp serves both sides: HTTP/1.1 keep-alive for scrapers, and a client for the pass-through,
without hand-parsing HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Sequence

import aiohttp
from aiohttp import web

log = logging.getLogger("dynamo_bridge")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Headers that belong to one hop, not to the pass-through response.
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "server", "date"}


def free_loopback_port() -> int:
    """A port that is free on 127.0.0.1 now (for the frontend's private metrics server)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class MetricsServer:
    """Serves `/metrics` from `sources` (+ the frontend's) on `address:port`; proxies the rest.

    `sources` are called on the event loop at each scrape and return Prometheus text.
    `frontend_port` is the private port of Dynamo's frontend HTTP server; None = no frontend.
    `ready` says whether the server is ready under Triton's strict readiness (on the loop).
    """

    def __init__(
        self,
        address: str,
        port: int,
        sources: Sequence[Callable[[], str]],
        frontend_port: int | None = None,
        frontend_timeout: float = 5.0,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        self.address = address
        self.port = port
        self.sources = list(sources)
        self.frontend_port = frontend_port
        self.ready = ready
        self._timeout = aiohttp.ClientTimeout(total=frontend_timeout)
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v2/health/live", self._live)
        app.router.add_get("/v2/health/ready", self._ready)
        app.router.add_route("*", "/{tail:.*}", self._pass_through)
        self._session = aiohttp.ClientSession(timeout=self._timeout, auto_decompress=False)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.address, self.port).start()
        if self.port == 0:  # any free port (a worker's default): say which
            self.port = self._runner.addresses[0][1]
        log.info("metrics on http://%s:%d/metrics", self.address, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def render(self) -> str:
        """The whole exposition: our sources, then the frontend's /metrics."""
        parts = [source() for source in self.sources]
        frontend = await self._frontend_metrics()
        if frontend:
            parts.append(frontend)
        return "".join(p if not p or p.endswith("\n") else p + "\n" for p in parts)

    async def _metrics(self, request: web.Request) -> web.Response:
        body = await self.render()
        return web.Response(body=body.encode(), headers={"Content-Type": CONTENT_TYPE})

    async def _live(self, request: web.Request) -> web.Response:
        return web.Response(status=200, content_type="text/plain")

    async def _ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready() else 400, content_type="text/plain")

    async def _frontend_metrics(self) -> str:
        if self.frontend_port is None or self._session is None:
            return ""
        try:
            url = f"http://127.0.0.1:{self.frontend_port}/metrics"
            async with self._session.get(url) as response:
                if response.status != 200:
                    return ""
                return await response.text()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            # Starting up or shutting down: serve what we have rather than fail the scrape.
            log.debug("frontend /metrics unavailable: %s", exc)
            return ""

    async def _pass_through(self, request: web.Request) -> web.StreamResponse:
        if self.frontend_port is None or self._session is None:
            raise web.HTTPNotFound()
        url = f"http://127.0.0.1:{self.frontend_port}{request.rel_url}"
        headers = {
            k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS | {"host"}
        }
        try:
            async with self._session.request(
                request.method, url, headers=headers, data=await request.read()
            ) as upstream:
                body = await upstream.read()
                kept = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_HEADERS}
                return web.Response(status=upstream.status, body=body, headers=kept)
        except (aiohttp.ClientError, asyncio.TimeoutError):
            raise web.HTTPServiceUnavailable(text="frontend unavailable") from None
