"""The HTTP door's ASGI application: Triton 2.51's HTTP/REST routes over a `TritonService`.

Handlers are plain `async def (request) -> Response` functions, grouped by concern in their
modules; they reach the service as `request.app.state.service` and refuse by raising
`DoorError`, which becomes Triton's status and `{"error": text}` here, once. A path Triton
does not serve is 404 `{"error":"Not Found"}`, a known path with the wrong method 405
`{"error":"Method Not Allowed"}`, as Triton answers them [V].

Model paths take an optional `/versions/<v>` where `<v>` is digits only: Triton matches
nothing else there, so `/versions/abc/ready` is a 404 as on Triton [V].
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from model_repository_loader.pb_utils.errors import ErrorCode

from ..door_error import DoorError
from . import (
    generate,
    health,
    infer,
    log_trace_settings,
    models,
    repository,
    security,
    shared_memory,
)
from .error_status import error_body, error_response, error_response_body, plain

if TYPE_CHECKING:
    from ..service import TritonService
    from .server import HttpOptions


class _Digits(Convertor[str]):
    """A path segment of digits, kept as text (the service parses versions itself)."""

    regex = "[0-9]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("digits", _Digits())

MODEL = "/v2/models/{model}"
VERSION = "/v2/models/{model}/versions/{version:digits}"


def route(path: str, endpoint: Callable[[Request], Any], methods: Iterable[str]) -> Route:
    """A route answering exactly `methods` (Starlette would add HEAD to GET; Triton's 405)."""
    made = Route(path, endpoint, methods=list(methods))
    made.methods = set(methods)
    return made


def model_routes(
    suffix: str, endpoint: Callable[[Request], Any], methods: Iterable[str]
) -> list[Route]:
    """The route for `/v2/models/<m><suffix>` and its `/versions/<v>` form."""
    return [route(MODEL + suffix, endpoint, methods), route(VERSION + suffix, endpoint, methods)]


def health_routes() -> list[BaseRoute]:
    return [
        route("/v2/health/live", health.live, ["GET"]),
        route("/v2/health/ready", health.ready, ["GET"]),
    ]


def repository_routes() -> list[BaseRoute]:
    return [
        route("/v2/repository/index", repository.index, ["POST"]),
        route("/v2/repository/models/{model}/load", repository.load, ["POST"]),
        route("/v2/repository/models/{model}/unload", repository.unload, ["POST"]),
    ]


def shared_memory_routes() -> list[BaseRoute]:
    """`/v2/<kind>/status|unregister` and `/v2/<kind>/region/<r>/status|register|unregister`,
    for kind systemsharedmemory and cudasharedmemory."""
    table: list[BaseRoute] = []
    for kind, status, register, unregister in (
        (
            "systemsharedmemory",
            shared_memory.system_status,
            shared_memory.system_register,
            shared_memory.system_unregister,
        ),
        (
            "cudasharedmemory",
            shared_memory.cuda_status,
            shared_memory.cuda_register,
            shared_memory.cuda_unregister,
        ),
    ):
        for prefix in (f"/v2/{kind}", f"/v2/{kind}/region/{{region}}"):
            table.append(route(f"{prefix}/status", status, ["GET"]))
            table.append(route(f"{prefix}/unregister", unregister, ["POST"]))
        table.append(route(f"/v2/{kind}/region/{{region}}/register", register, ["POST"]))
    return table


def control_routes() -> list[BaseRoute]:
    """The control port's routes (`--control-port`): Triton's repository API and health."""
    return [*health_routes(), *repository_routes()]


def routes() -> list[BaseRoute]:
    """The route table. Starlette tries the routes in order, so infer, the route of nearly
    every request, comes first (no other route's path ends in `/infer`); `/v2/models/stats`
    (every model) comes before the model routes, where it would otherwise read as the
    metadata of a model named 'stats'."""
    return [
        *model_routes("/infer", infer.infer, ["POST"]),
        *health_routes(),
        route("/v2", models.server_metadata, ["GET"]),
        route("/v2/models/stats", models.model_stats, ["GET"]),
        *model_routes("", models.model_metadata, ["GET"]),
        *model_routes("/ready", health.model_ready, ["GET"]),
        *model_routes("/config", models.model_config, ["GET"]),
        *model_routes("/stats", models.model_stats, ["GET"]),
        *model_routes("/generate", generate.generate, ["POST"]),
        *model_routes("/generate_stream", generate.generate_stream, ["POST"]),
        *repository_routes(),
        *shared_memory_routes(),
        route("/v2/logging", log_trace_settings.logging, ["GET", "POST"]),
        route("/v2/trace/setting", log_trace_settings.trace, ["GET", "POST"]),
        route(MODEL + "/trace/setting", log_trace_settings.trace, ["GET", "POST"]),
    ]


async def _door_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, DoorError)
    return error_response(exc)


async def _unexpected(request: Request, exc: Exception) -> Response:
    """A failure of the door itself: 500 in Triton's form (Starlette logs the traceback)."""
    return error_response(DoorError(ErrorCode.INTERNAL, f"internal error: {exc}"))


_HTTP_TEXTS = {404: "Not Found", 405: "Method Not Allowed"}
# Triton labels its 405 `application/json` on the routes that answer JSON, else `text/plain` [V].
_JSON_ENDPOINTS = frozenset(
    {
        models.server_metadata,
        models.model_metadata,
        models.model_config,
        models.model_stats,
        repository.index,
        shared_memory.system_status,
        shared_memory.system_register,
        shared_memory.system_unregister,
        shared_memory.cuda_status,
        shared_memory.cuda_register,
        shared_memory.cuda_unregister,
        log_trace_settings.logging,
        log_trace_settings.trace,
    }
)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    body = error_body(_HTTP_TEXTS.get(exc.status_code, exc.detail))
    if request.scope.get("endpoint") in _JSON_ENDPOINTS:
        return error_response_body(body, exc.status_code)
    return plain(body, exc.status_code)


class RawPath:
    """Routes match the path as sent: Triton does not decode `%XX` in it (a model named
    `a%20b` is not `a b`) [V]."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path")
        if raw is not None:
            scope["path"] = raw.decode("latin-1")
        await self.app(scope, receive, send)


def make_app(service: TritonService, options: HttpOptions) -> Starlette:
    """Triton's HTTP API over `service` (the control port's part of it: `options.control`),
    each route guarded as security.py says."""
    table = control_routes() if options.control else routes()
    app = Starlette(
        routes=security.guard(
            table,
            options.restricted,
            control=options.control,
            hosts=security.HostRule.for_address(options.address, options.allowed_hosts),
            max_input_size=options.max_input_size,
        ),
        middleware=[Middleware(RawPath)],
        exception_handlers={
            DoorError: _door_error,
            HTTPException: _http_error,
            Exception: _unexpected,
        },
    )
    app.router.redirect_slashes = False  # `/v2/health/live/` is a 404 on Triton [V]
    app.state.service = service
    app.state.options = options
    return app
