"""Who may call what on the HTTP door: the web-page guard, the Host rule, body limits and the
restricted API groups.

All are attached to the routes themselves (`guard(routes, options)` wraps each route's ASGI
app), so whatever spelling of a path reaches a handler has passed its checks; a path no route
matches is a 404, as on Triton. One rule, keyed by method, covers every state-changing route:

- **Host** (every request): DNS rebinding points a name the attacker owns at the door, so a
  page of theirs becomes same-origin with it. `--http-allowed-hosts` lists the names the door
  answers to (`name`, `name:port`, `[v6]:port`; no port: any; `*`: any name); loopback names
  (`localhost`, 127.0.0.0/8, `[::1]`) always. With no list a door on a loopback address
  answers only to those, and a door on another address to any Host. Another Host is 403.
- **Every POST** (load, unload, index, shared memory, `/v2/logging`, trace settings, infer,
  generate, generate_stream; on the control port every route), before its body is read:
  - from a web page only from the door's own origin: an `Origin` (or a `Sec-Fetch-Site` other
    than same-origin / none, which browsers send with every request) is 403 unless the Origin
    has the request's scheme and is a loopback name on the door's port, or exactly the
    request's Host when that Host is a loopback name or one listed in `--http-allowed-hosts`.
    Origin == Host alone is not enough: a rebinding page has that;
  - bodies labelled as only what real clients send: no Content-Type (tritonclient.http),
    `application/json` (curl -H, Triton's C++ client for JSON tensors), `application/octet-stream`
    (tritonclient.http.aio for every body, the C++ client for binary tensors), and
    `application/x-www-form-urlencoded` only from a non-browser (libcurl's default label for
    `curl -d` and for every non-infer POST of Triton's C++ client and perf_analyzer). Anything
    else (text/plain, multipart/form-data, ...) is 415. A browser's "simple" cross-site POST
    carries an Origin and is refused above, whatever its label;
  - a body over `--http-max-input-size` (Triton's flag, 64 MB by default, as its
    HTTP_DEFAULT_MAX_INPUT_SIZE) is Triton's 400 "request JSON size of <n> bytes exceeds the
    maximum allowed input size of <m> bytes. Use --http-max-input-size to increase the limit.",
    from Content-Length or while a chunked body is read.
  Every refusal is `{"error": text}` and closes the connection (its body was not read).
- `--http-restricted-api=<group>[,<group>...]:<key>=<value>` (tritonserver's flag and groups,
  bridge/restrictions.py): the routes of those groups answer only requests carrying the header
  `<key>: <value>`; any other gets Triton's 403 "This API is restricted, expecting header
  '<key>'" [V] before its body is read.
- A load runs code: its body (and every body on the control port) must also arrive within
  READ_TIMEOUT_S of silence and REQUEST_TIMEOUT_S in all (408).
- Every route's head and body deadlines, keep-alive and the connection cap are
  connections.py's.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ....restrictions import Restriction
from . import generate, health, infer, log_trace_settings, models, repository, shared_memory
from .error_status import encode_json
from .limits import DEFAULT_MAX_INPUT_SIZE, body_too_large

READ_TIMEOUT_S = 5.0  # longest silence while a load's body is awaited
REQUEST_TIMEOUT_S = 120.0  # longest time to receive one whole load

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
    log_trace_settings.logging: "logging",
    log_trace_settings.trace: "trace",
}
# The routes that run code on the workers: their bodies also have deadlines.
LOADS = frozenset({repository.load, repository.unload})
# The method of every route that changes state (a GET never does on Triton's API).
STATE_CHANGING = "POST"
# Body labels real clients send (module docstring); form-urlencoded only from non-browsers.
_BODY_TYPES = frozenset({"application/json", "application/octet-stream"})
_CLIENT_FORM = "application/x-www-form-urlencoded"
_SAME_SITE_FETCH = frozenset({"same-origin", "none"})
_LOOPBACK_NAMES = ("localhost", "localhost.")
_LONGEST_NAME = 255  # a DNS name (253, with a final dot 254), or an IPv6 literal in brackets


def restricted_text(header: str) -> str:
    return f"This API is restricted, expecting header '{header}'"


class Refused(Exception):
    """Answer `status` with `message` (`{"error"}`) and close the connection."""

    def __init__(self, status: int, message: str, media_type: str = "application/json") -> None:
        super().__init__(message)
        self.status = status
        self.media_type = media_type


@dataclass(frozen=True, slots=True)
class HostRule:
    """The names the door answers to. A loopback name is always one (a rebinding attacker's
    page never has one); `names` are those `--http-allowed-hosts` lists as (name, port or "");
    `any_host`: the Host is not checked (`*`, or a door on a non-loopback address with no
    list), and only loopback names are then trusted as a web page's origin."""

    names: frozenset[tuple[str, str]] = frozenset()
    any_host: bool = False

    @classmethod
    def for_address(cls, address: str, allowed: Iterable[str] | None = None) -> HostRule:
        if allowed is None:
            return cls(any_host=not _is_loopback_name(address))
        entries = [entry.strip().lower() for entry in allowed if entry.strip()]
        names = frozenset(_split_host(entry) for entry in entries if entry != "*")
        return cls(names, any_host="*" in entries)

    def allows(self, host: str) -> bool:
        return self.any_host or self.trusted(host)

    def trusted(self, host: str) -> bool:
        """`host` is a name of the door's: loopback, or listed."""
        name, port = _split_host(host)
        return _is_loopback_name(name) or (name, port) in self.names or (name, "") in self.names


def parse_allowed_hosts(text: str | None) -> tuple[str, ...] | None:
    """`--http-allowed-hosts` as given: a comma list of `name[:port]`, `[v6][:port]` or `*`."""
    if text is None:
        return None
    entries = tuple(entry.strip() for entry in text.split(",") if entry.strip())
    for entry in entries:
        name, port = _split_host(entry)
        if not name or (port and not port.isdigit()) or any(c in name for c in "/@ "):
            raise ValueError(f"--http-allowed-hosts: '{entry}' is not a host name[:port]")
    return entries


class Limits:
    """The deadlines of a load's body (attributes, so a test or an operator may tune)."""

    read_timeout = READ_TIMEOUT_S
    request_timeout = REQUEST_TIMEOUT_S


def _is_loopback_name(name: str) -> bool:
    name = name.strip().lower()
    # No host name or address is longer; kept out of the cache below, so that it holds at most
    # its count of short names whatever a client sends.
    return len(name) <= _LONGEST_NAME and _is_loopback(name)


# Every request's Host is checked, and parsing an address is most of what that costs; a client
# sends the same few names, so the answers are kept (bounded: a client varying its Host only
# makes each one a miss, as before).
@functools.lru_cache(maxsize=256)
def _is_loopback(name: str) -> bool:
    if name in _LOOPBACK_NAMES:
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


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


class _Guard:
    """One route's checks in front of its ASGI app (module docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        restriction: Restriction | None,
        every_method: bool,
        deadlines: bool,
        hosts: HostRule,
        max_input_size: int,
        limits: Limits,
    ) -> None:
        self.app = app
        self.restriction = restriction
        self.every_method = every_method  # the control port: every request as a write
        self.deadlines = deadlines
        self.hosts = hosts
        self.max_input_size = max_input_size
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            host = headers.get("host")
            if host is not None and not self.hosts.allows(host):
                raise Refused(403, f"refused: Host '{host}' is not an allowed host")
            writes = self.every_method or scope.get("method") == STATE_CHANGING
            if writes:
                self._admit_write(scope, headers)
            if self.restriction is not None and not self.restriction.allows(headers):
                raise Refused(403, restricted_text(self.restriction.header), "text/plain")
            if writes and _has_body(headers):
                receive = self._capped(receive)
                if self.deadlines:
                    receive = self._bounded(receive)
            await self.app(scope, receive, tracked)
        except Refused as exc:
            if started:
                raise
            await _refuse(send, exc)

    def _admit_write(self, scope: Scope, headers: Mapping[str, str]) -> None:
        origin = headers.get("origin")
        fetch_site = headers.get("sec-fetch-site", "").strip().lower()
        browser = origin is not None or bool(fetch_site)
        if origin is not None and not self._own_origin(origin, scope, headers.get("host")):
            raise Refused(403, f"cross-origin request refused: Origin '{origin}' is not allowed")
        if fetch_site and fetch_site not in _SAME_SITE_FETCH:
            raise Refused(403, f"cross-origin request refused: Sec-Fetch-Site '{fetch_site}'")
        content_type = headers.get("content-type")
        if content_type is not None and _has_body(headers):
            media = _media_type(content_type)
            if media not in _BODY_TYPES and (browser or media != _CLIENT_FORM):
                raise Refused(
                    415,
                    f"unsupported Content-Type '{content_type}': the request body must be "
                    "JSON (application/json) or Triton's binary tensor data "
                    "(application/octet-stream)",
                )
        length = headers.get("content-length", "0").strip() or "0"
        if length.isdigit() and int(length) > self.max_input_size:
            raise Refused(400, body_too_large(int(length), self.max_input_size))

    def _own_origin(self, origin: str, scope: Scope, host: str | None) -> bool:
        """The Origin is the door's own (module docstring): the request's scheme, and a
        loopback name on the door's port, or exactly the request's Host when that Host is a
        name the door was told it has (a forwarded port)."""
        scheme, sep, authority = origin.strip().lower().partition("://")
        if not sep or scheme != scope.get("scheme", "http"):
            return False
        name, port = _split_host(authority)
        if _is_loopback_name(name) and port == str((scope.get("server") or ("", 0))[1]):
            return True
        return host is not None and self.hosts.trusted(host) and (name, port) == _split_host(host)

    def _capped(self, receive: Receive) -> Receive:
        """`receive` that refuses a body growing past the limit (a chunked body has no
        Content-Length to refuse it by)."""
        size = 0
        limit = self.max_input_size

        async def capped() -> Message:
            nonlocal size
            message = await receive()
            if message["type"] == "http.request":
                size += len(message.get("body", b""))
                if size > limit:
                    raise Refused(400, body_too_large(size, limit, complete=False))
            return message

        return capped

    def _bounded(self, receive: Receive) -> Receive:
        """`receive` with a load's deadlines."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.request_timeout
        done = False

        async def bounded() -> Message:
            nonlocal done
            if done:  # after the body: a disconnect, waited for by whoever asks
                return await receive()
            wait = min(self.limits.read_timeout, deadline - loop.time())
            try:
                message = await asyncio.wait_for(receive(), max(wait, 0.0))
            except asyncio.TimeoutError:
                raise Refused(408, "request not received in time") from None
            if message["type"] == "http.request":
                done = not message.get("more_body", False)
            return message

        return bounded


def _has_body(headers: Mapping[str, str]) -> bool:
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    return chunked or headers.get("content-length", "0").strip() not in ("", "0")


async def _refuse(send: Send, refusal: Refused) -> None:
    body = encode_json({"error": str(refusal)})
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
    hosts: HostRule | None = None,
    max_input_size: int = DEFAULT_MAX_INPUT_SIZE,
    limits: Limits | None = None,
) -> list[BaseRoute]:
    """`routes` with their checks attached. `control`: every route guarded as a write, with a
    load's deadlines (the control port)."""
    hosts = hosts if hosts is not None else HostRule()
    limits = limits or Limits()
    out = []
    for route in routes:
        if isinstance(route, Route):
            restriction = restricted.get(GROUP_OF.get(route.endpoint, ""))
            deadlines = control or route.endpoint in LOADS
            route.app = _Guard(
                route.app, restriction, control, deadlines, hosts, max_input_size, limits
            )
        out.append(route)
    return out
