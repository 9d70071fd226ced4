"""The metrics port: one scrape target for Triton's metrics, custom metrics and Dynamo's own.

Dynamo's KServe frontend insists on serving its own HTTP port (`/metrics` with the
`dynamo_frontend_*` families, `/health`, `/live`, `/v1/models`, `/docs`, `POST /busy_threshold`,
...), and a callback registered with `register_prometheus_expfmt_callback` does not reach that
`/metrics` (spec dynamo_runtime.md §8). So the bridge serves the public `--metrics-port` itself:

* `GET /metrics`: every source's text (Triton's `nv_inference_*`, the models' custom families),
  then the frontend's own `/metrics`, fetched at each scrape;
* `GET /v2/health/live` and `GET /v2/health/ready`: Triton's HTTP health paths, with Triton's
  answers (200, or 400 when not ready; empty text/plain bodies [V on 2.51]). Readiness is strict,
  as Triton's default: every model the server tried to load is ready (the `ready` callable); one
  that failed, or was unloaded since, makes the server not ready, as in Triton 2.51.
  Dynamo's frontend answers these paths 404, and its gRPC ServerReady says true regardless;
  this is the honest answer for health checks that cannot ask ModelReady per model;
* `GET /health` and `GET /live`: passed through to the frontend (Dynamo's own probes),
  except `/health` while discovery does not work (etcd away, lease lost: bridge/roles/discovery.py),
  answered 503 here, as Dynamo's system status server answers when not ready;
* nothing else: another path is 404 and another method 405, so the frontend's other routes
  (its API documents, model list and `POST /busy_threshold`) are not reachable through here.

It is the same HTTP stack as the triton door (Starlette on uvicorn's httptools, inside the
runtime's loop, bridge/frontends/triton/http/listener.py) under the same connection limits
(connections.py: head and body deadlines, keep-alive, a cap); httpx fetches from the frontend.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Sequence

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..frontends.triton.http.connections import ConnectionLimits
from ..frontends.triton.http.listener import Listener

log = logging.getLogger("dynamo_bridge")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PASSED_THROUGH = ("/health", "/live")  # GET only: Dynamo's frontend's own probes
# Of the frontend's answer, what a probe reads; the rest belongs to that hop.
_KEPT_HEADERS = ("content-type",)


def free_loopback_port() -> int:
    """A port that is free now (for the frontend's HTTP server, which binds every interface:
    bridge/roles/frontend.py)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class MetricsServer:
    """Serves `/metrics` from `sources` (+ the frontend's) on `address:port`, Triton's health
    paths, and the frontend's `/health` and `/live`.

    `sources` are called on the event loop at each scrape and return Prometheus text.
    `frontend_port` is the port of Dynamo's frontend HTTP server; None = no frontend.
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
        limits: ConnectionLimits | None = None,
        discovery_usable: Callable[[], bool] = lambda: True,
    ) -> None:
        self.address = address
        self.sources = list(sources)
        self.frontend_port = frontend_port
        self.ready = ready
        # False while etcd does not answer or the lease is lost (bridge/roles/discovery.py):
        # the frontend's /health, passed through, would still say healthy.
        self.discovery_usable = discovery_usable
        self._timeout = frontend_timeout
        self._client: httpx.AsyncClient | None = None
        routes = [
            Route("/metrics", self._metrics, methods=["GET"]),
            Route("/v2/health/live", self._live, methods=["GET"]),
            Route("/v2/health/ready", self._ready, methods=["GET"]),
        ]
        if frontend_port is not None:
            routes += [
                Route(
                    path, self._health if path == "/health" else self._pass_through, methods=["GET"]
                )
                for path in PASSED_THROUGH
            ]
        self._listener = Listener(
            Starlette(routes=routes), address, port, limits or ConnectionLimits(), what="metrics"
        )

    @property
    def port(self) -> int:
        return self._listener.port

    async def start(self) -> None:
        if self.frontend_port is not None:
            self._client = httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{self.frontend_port}", timeout=self._timeout
            )
        await self._listener.start()
        log.info("metrics on http://%s:%d/metrics", self.address, self.port)

    async def stop(self) -> None:
        await self._listener.stop(grace=1.0)
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def render(self) -> str:
        """The whole exposition: our sources, then the frontend's /metrics."""
        parts = [source() for source in self.sources]
        frontend = await self._frontend_metrics()
        if frontend:
            parts.append(frontend)
        return "".join(p if not p or p.endswith("\n") else p + "\n" for p in parts)

    async def _metrics(self, request: Request) -> Response:
        return Response((await self.render()).encode(), headers={"Content-Type": CONTENT_TYPE})

    async def _live(self, request: Request) -> Response:
        return Response(status_code=200, media_type="text/plain")

    async def _ready(self, request: Request) -> Response:
        return Response(status_code=200 if self.ready() else 400, media_type="text/plain")

    async def _health(self, request: Request) -> Response:
        if not self.discovery_usable():  # Dynamo's own answer when not ready: 503
            return JSONResponse(
                {"status": "notready", "message": "discovery (etcd) does not answer"},
                status_code=503,
            )
        return await self._pass_through(request)

    async def _frontend_metrics(self) -> str:
        if self._client is None:
            return ""
        try:
            response = await self._client.get("/metrics")
        except httpx.HTTPError as exc:
            # Starting up or shutting down: serve what we have rather than fail the scrape.
            log.debug("frontend /metrics unavailable: %s", exc)
            return ""
        return response.text if response.status_code == 200 else ""

    async def _pass_through(self, request: Request) -> Response:
        assert self._client is not None  # the route exists only with a frontend
        try:
            upstream = await self._client.get(request.url.path)
        except httpx.HTTPError:
            return Response("frontend unavailable", status_code=503, media_type="text/plain")
        kept = {k: v for k, v in upstream.headers.items() if k.lower() in _KEPT_HEADERS}
        return Response(upstream.content, status_code=upstream.status_code, headers=kept)
