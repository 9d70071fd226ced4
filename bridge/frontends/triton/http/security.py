"""Who may call what on the HTTP door: restricted API groups, and the guard on model loading.

Both are attached to the routes themselves (`guard(routes, options)` wraps each route's ASGI
app), so whatever spelling of a path reaches a handler has passed its checks; a path no route
matches is a 404, as on Triton.

- `--http-restricted-api=<group>[,<group>...]:<key>=<value>` (tritonserver's flag and groups,
  bridge/restrictions.py): the routes of those groups answer only requests carrying the header
  `<key>: <value>`; any other gets Triton's 403 "This API is restricted, expecting header
  '<key>'" [V] before its body is read.
- A load runs code, so whoever sends one must be someone the operator meant. The repository
  writes (load, unload), and every route of the control port, refuse before reading the body:
  a request from a web page (403: an `Origin` other than the door's own loopback origin; on a
  door bound to loopback, a `Host` that is not a loopback name, i.e. DNS rebinding), a body
  labelled as anything but JSON (415; no Content-Type at all is taken, as tritonclient.http
  sends none, and browsers always send an Origin with a POST), a body over MAX_BODY_BYTES (413,
  from Content-Length or while reading a chunked body), a body that stalls for READ_TIMEOUT_S
  or takes over REQUEST_TIMEOUT_S in all (408). Such a refusal closes the connection.
  Every route's head and body deadlines, and the connection cap, are connections.py's.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ....restrictions import Restriction
from . import generate, health, infer, models, repository, settings, shared_memory

MAX_BODY_BYTES = 256 * 1024 * 1024  # a model's files travel in the body of a load
READ_TIMEOUT_S = 5.0  # longest silence while a guarded request's body is awaited
REQUEST_TIMEOUT_S = 120.0  # longest time to receive one whole guarded request

# Each handler's group, as Triton groups its HTTP routes.
GROUP_OF: dict[Callable[..., Any], str] = {
    health.live: "health",
    health.ready: "health",
    health.model_ready: "health",
    models.server_metadata: "metadata",
    models.model_metadata: "metadata",
    models.model_config: "model-config",
    models.model_stats: "statistics",
    infer.infer: "inference",
    generate.generate: "inference",
    generate.generate_stream: "inference",
    repository.index: "model-repository",
    repository.load: "model-repository",
    repository.unload: "model-repository",
    shared_memory.system_status: "shared-memory",
    shared_memory.system_register: "shared-memory",
    shared_memory.system_unregister: "shared-memory",
    shared_memory.cuda_status: "shared-memory",
    shared_memory.cuda_register: "shared-memory",
    shared_memory.cuda_unregister: "shared-memory",
    settings.logging: "logging",
    settings.trace: "trace",
}
# The routes that run code on the workers.
WRITES = frozenset({repository.load, repository.unload})


def restricted_text(header: str) -> str:
    return f"This API is restricted, expecting header '{header}'"


class Refused(Exception):
    """Answer `status` with `message` (`{"error"}`) and close the connection."""

    def __init__(self, status: int, message: str, media_type: str = "application/json") -> None:
        super().__init__(message)
        self.status = status
        self.media_type = media_type


class Limits:
    """The body limits of guarded requests (attributes, so a test or an operator may tune)."""

    max_body = MAX_BODY_BYTES
    read_timeout = READ_TIMEOUT_S
    request_timeout = REQUEST_TIMEOUT_S


def _is_loopback_name(name: str) -> bool:
    name = name.strip().lower()
    if name in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def _split_host(host: str) -> tuple[str, str]:
    """A Host header (or an origin's authority) as (name, port text)."""
    host = host.strip().lower()
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        return name, rest.removeprefix(":")
    if host.count(":") == 1:
        name, _, port = host.partition(":")
        return name, port
    return host, ""


class _Guard:
    """One route's checks in front of its ASGI app (module docstring)."""

    def __init__(
        self, app: ASGIApp, restriction: Restriction | None, loading: bool, limits: Limits
    ) -> None:
        self.app = app
        self.restriction = restriction
        self.loading = loading
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            if self.loading:
                self._admit_loader(scope, headers)
            if self.restriction is not None and not self.restriction.allows(headers):
                raise Refused(403, restricted_text(self.restriction.header), "text/plain")
            if self.loading:
                receive = self._bounded(receive, headers)
            await self.app(scope, receive, tracked)
        except Refused as exc:
            if started:
                raise
            await _refuse(send, exc)

    def _admit_loader(self, scope: Scope, headers: Mapping[str, str]) -> None:
        server = scope.get("server") or ("", 0)
        on_loopback = _is_loopback_name(str(server[0]))
        host = headers.get("host")
        if on_loopback and host is not None and not _is_loopback_name(_split_host(host)[0]):
            raise Refused(403, f"refused: Host '{host}' is not a loopback name")
        origin = headers.get("origin")
        if origin is not None and not self._own_origin(origin, scope, host, on_loopback):
            raise Refused(403, f"cross-origin request refused: Origin '{origin}' is not allowed")
        content_type = headers.get("content-type")
        if content_type is not None and _has_body(headers):
            if content_type.split(";", 1)[0].strip().lower() != "application/json":
                raise Refused(
                    415,
                    f"the request body must be JSON: Content-Type '{content_type}' is not "
                    "application/json",
                )
        length = headers.get("content-length", "0").strip() or "0"
        if length.isdigit() and int(length) > self.limits.max_body:
            raise Refused(413, self._too_large())

    @staticmethod
    def _own_origin(origin: str, scope: Scope, host: str | None, on_loopback: bool) -> bool:
        scheme, sep, authority = origin.strip().lower().partition("://")
        if not sep or scheme != scope.get("scheme", "http"):
            return False
        name, port = _split_host(authority)
        server_port = str((scope.get("server") or ("", 0))[1])
        if on_loopback:
            return _is_loopback_name(name) and port == server_port
        return host is not None and authority == host.strip().lower()

    def _too_large(self) -> str:
        return f"request body too large: the limit is {self.limits.max_body} bytes"

    def _bounded(self, receive: Receive, headers: Mapping[str, str]) -> Receive:
        """`receive` with the body's size and time limits."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.request_timeout
        size = 0
        done = not _has_body(headers)

        async def bounded() -> Message:
            nonlocal size, done
            if done:  # after the body: a disconnect, waited for by whoever asks
                return await receive()
            wait = min(self.limits.read_timeout, deadline - loop.time())
            try:
                message = await asyncio.wait_for(receive(), max(wait, 0.0))
            except asyncio.TimeoutError:
                raise Refused(408, "request not received in time") from None
            if message["type"] == "http.request":
                size += len(message.get("body", b""))
                if size > self.limits.max_body:
                    raise Refused(413, self._too_large())
                done = not message.get("more_body", False)
            return message

        return bounded


def _has_body(headers: Mapping[str, str]) -> bool:
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    return chunked or headers.get("content-length", "0").strip() not in ("", "0")


async def _refuse(send: Send, refusal: Refused) -> None:
    body = json.dumps({"error": str(refusal)}, separators=(",", ":")).encode()
    await send(
        {
            "type": "http.response.start",
            "status": refusal.status,
            "headers": [
                (b"content-type", refusal.media_type.encode()),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def guard(
    routes: Iterable[BaseRoute],
    restricted: Mapping[str, Restriction],
    control: bool = False,
    limits: Limits | None = None,
) -> list[BaseRoute]:
    """`routes` with their checks attached. `control`: every route guards like a load (the
    control port)."""
    limits = limits or Limits()
    out = []
    for route in routes:
        if isinstance(route, Route):
            restriction = restricted.get(GROUP_OF.get(route.endpoint, ""))
            loading = control or route.endpoint in WRITES
            if restriction is not None or loading:
                route.app = _Guard(route.app, restriction, loading, limits)
        out.append(route)
    return out
