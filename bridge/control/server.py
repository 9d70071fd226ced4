"""A small HTTP control for model loading, in the shape of Triton's model repository API.

Dynamo's KServe gRPC frontend has no repository RPCs (RepositoryModelLoad/Unload/Index), so the
bridge answers them itself on `--control-port`, bound to 127.0.0.1 only (loading code is not
something to expose). The URLs, bodies, status codes and error texts are Triton's HTTP ones [V],
so `curl` recipes and `tritonclient.http` repository calls written for Triton work:

    POST /v2/repository/index                     [{"name", "version", "state", "reason"?}, ...]
         body (optional): {"ready": true}
    POST /v2/repository/models/<model>/load       body (optional): {"parameters": {
             "config": "<JSON model config>", "file:<version>/<name>": "<base64 bytes>"}}
    POST /v2/repository/models/<model>/unload     body (optional): {"parameters": {...}}

Success is 200 with an empty body (a JSON list for the index); errors are {"error": "<text>"}
with 400 (INVALID_ARG), 500 (INTERNAL) or 503 (UNAVAILABLE).

A load runs code, so whoever may send one must be someone the operator meant:
- a request from a web page is refused (403): any `Origin` other than this port's own loopback
  origin, and any `Host` that is not a loopback name (DNS rebinding). A body must be JSON
  (415 otherwise); a body with no Content-Type at all is taken, as `tritonclient.http` sends
  none, and browsers always send an `Origin` with a POST;
- `--http-restricted-api=model-repository:<key>=<value>` (tritonserver's flag) requires the
  header `<key>: <value>` on every repository request, with Triton's 403 text otherwise.

HTTP/1.1 is parsed by h11 (sans-IO, the parser uvicorn uses): keep-alive, chunked bodies and
`Expect: 100-continue` as the protocol says. Uvicorn itself has no deadline for receiving a
request, which this port needs. A connection that stalls for READ_TIMEOUT_S, or does not deliver
a whole request within REQUEST_TIMEOUT_S, is dropped (408 if a request was under way); a body
over MAX_BODY_BYTES is refused with 413 before it is read; a malformed request is a 400, a
fault of the server a 500.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import json
import logging
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

import h11

from model_repository_loader.pb_utils.errors import ErrorCode

from ..models import NOT_EXPLICIT, ControlError, ModelManager
from ..restrictions import Restriction

log = logging.getLogger("dynamo_bridge")

# Triton's HTTP status for each code a load/unload answers with.
_STATUS = {
    ErrorCode.INVALID_ARG: 400,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.INTERNAL: 500,
    ErrorCode.UNAVAILABLE: 503,
}
MAX_BODY_BYTES = 256 * 1024 * 1024  # a model's files travel in the body of a load
READ_TIMEOUT_S = 5.0  # longest silence while a request (or the next one) is awaited
REQUEST_TIMEOUT_S = 120.0  # longest time to receive one whole request
_MAX_HEAD_BYTES = 64 * 1024
_READ_CHUNK = 256 * 1024


class _Refused(Exception):
    """Answer `status` with `message` and close the connection (the request was not read)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ControlServer:
    """Serves the repository API above for `manager`; `explicit` allows load and unload.

    `restriction`, if given, is the header every repository request must carry.
    """

    def __init__(
        self,
        manager: ModelManager,
        port: int,
        explicit: bool,
        restriction: Restriction | None = None,
    ) -> None:
        self.manager = manager
        self.port = port
        self.explicit = explicit
        self.restriction = restriction
        self.max_body = MAX_BODY_BYTES
        self.read_timeout = READ_TIMEOUT_S
        self.request_timeout = REQUEST_TIMEOUT_S
        self._origins = {f"http://{host}:{port}" for host in ("127.0.0.1", "localhost", "[::1]")}
        self._server: asyncio.AbstractServer | None = None
        self._idle: set[asyncio.StreamWriter] = set()  # connections waiting for a request
        self._stopping = False

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", self.port)
        log.info("model control (repository API) on http://127.0.0.1:%d", self.port)

    async def stop(self) -> None:
        """Stop listening and close idle connections; requests being handled finish first."""
        self._stopping = True
        if self._server is not None:
            self._server.close()
            for writer in list(self._idle):
                writer.close()
            # Python 3.12+ waits here for requests being handled; a load that never returns
            # must not hold up shutdown.
            closed = asyncio.ensure_future(self._server.wait_closed())
            await asyncio.wait({closed}, timeout=self.read_timeout)

    # -- HTTP ----------------------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_HEAD_BYTES)
        try:
            while not self._stopping and await self._exchange(conn, reader, writer):
                conn.start_next_cycle()
        except (ConnectionError, h11.LocalProtocolError):
            pass  # the client went away, or cannot take an answer any more
        finally:
            self._idle.discard(writer)
            writer.close()

    async def _exchange(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Read one request and answer it; True if the connection can carry another."""
        deadline = asyncio.get_running_loop().time() + self.request_timeout
        request: h11.Request | None = None
        try:
            self._idle.add(writer)
            event = await self._next_event(conn, reader, deadline)
            self._idle.discard(writer)
            if not isinstance(event, h11.Request):
                return False  # the client closed the connection
            request = event
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in request.headers}
            method = request.method.decode("latin-1")
            parts = _path_parts(request.target)
            self._admit(parts, headers)
            if conn.they_are_waiting_for_100_continue:
                writer.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])))
            raw = await self._body(conn, reader, deadline)
        except _Refused as exc:
            target = request.target if request is not None else None
            log.warning("model control: refused %s: %s", _cut(target), _cut(str(exc)))
            await self._respond(conn, writer, request, exc.status, {"error": str(exc)}, close=True)
            return False
        except h11.RemoteProtocolError as exc:
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                status = exc.error_status_hint
                body = {"error": f"malformed HTTP request: {exc}"}
                await self._respond(conn, writer, request, status, body, close=True)
            return False
        except TimeoutError:
            # Silence between requests just ends the connection; within one, it is answered.
            if request is not None or conn.trailing_data[0]:
                body = {"error": "request not received in time"}
                await self._respond(conn, writer, request, 408, body, close=True)
            return False
        try:
            status, payload = await self.handle(method, parts, raw)
        except Exception as exc:  # a fault of ours: say so, and keep serving
            log.exception("model control: %s %s failed", method, _cut(request.target))
            status, payload = 500, {"error": f"internal error: {type(exc).__name__}: {exc}"}
        await self._respond(conn, writer, request, status, payload, close=self._stopping)
        return conn.our_state is h11.DONE and conn.their_state is h11.DONE

    async def _next_event(
        self, conn: h11.Connection, reader: asyncio.StreamReader, deadline: float
    ) -> Any:
        loop = asyncio.get_running_loop()
        while (event := conn.next_event()) is h11.NEED_DATA:
            wait = min(self.read_timeout, deadline - loop.time())
            if wait <= 0:
                raise TimeoutError
            try:
                data = await asyncio.wait_for(reader.read(_READ_CHUNK), wait)
            except asyncio.TimeoutError:
                raise TimeoutError from None
            conn.receive_data(data)  # b"" is the end of the stream
        return event

    def _admit(self, parts: list[str], headers: dict[str, str]) -> None:
        """Refuse, before its body is read, a request this port must not act on."""
        host = headers.get("host")
        if host is not None and not _is_loopback_host(host):
            raise _Refused(403, f"refused: Host '{host}' is not a loopback name")
        origin = headers.get("origin")
        if origin is not None and origin.lower() not in self._origins:
            raise _Refused(403, f"cross-origin request refused: Origin '{origin}' is not allowed")
        if parts[:2] != ["v2", "repository"]:
            return  # answered 404 by handle()
        if self.restriction is not None and not self.restriction.allows(headers):
            raise _Refused(
                403, f"This API is restricted, expecting header '{self.restriction.header}'"
            )
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = int(headers.get("content-length", "0") or 0)  # h11 checked it is a number
        content_type = headers.get("content-type")
        if (length or chunked) and content_type is not None:
            if content_type.split(";", 1)[0].strip().lower() != "application/json":
                raise _Refused(
                    415,
                    f"the request body must be JSON: Content-Type '{content_type}' is not "
                    "application/json",
                )
        if length > self.max_body:
            raise _Refused(413, self._too_large())

    async def _body(
        self, conn: h11.Connection, reader: asyncio.StreamReader, deadline: float
    ) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            event = await self._next_event(conn, reader, deadline)
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > self.max_body:
                    raise _Refused(413, self._too_large())
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(chunks)
            else:  # ConnectionClosed in the middle of a body
                raise ConnectionResetError("the client closed the connection mid-request")

    def _too_large(self) -> str:
        return f"request body too large: the limit is {self.max_body} bytes"

    async def _respond(
        self,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        request: h11.Request | None,
        status: int,
        body: Any,
        close: bool,
    ) -> None:
        # Compact, as Triton writes it.
        payload = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = [("content-type", "application/json"), ("content-length", str(len(payload)))]
        if close:
            headers.append(("connection", "close"))
        reason = HTTPStatus(status).phrase.encode()
        data = conn.send(h11.Response(status_code=status, headers=headers, reason=reason))
        if request is None or request.method != b"HEAD":
            data += conn.send(h11.Data(data=payload)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
        writer.write(data)
        try:  # a client that sends but never reads must not hold the connection forever
            await asyncio.wait_for(writer.drain(), self.request_timeout)
        except asyncio.TimeoutError:
            raise ConnectionResetError("the client does not read its answers") from None

    # -- the repository API --------------------------------------------------------------------

    async def handle(self, method: str, parts: list[str], raw: bytes) -> tuple[int, Any]:
        """(status, JSON body or None) for one request to the path `parts` (_path_parts)."""
        if parts[:2] != ["v2", "repository"]:
            return 404, {"error": "Not Found"}
        if method != "POST":
            return 405, {"error": "Method Not Allowed"}
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError as exc:
            return 500, {"error": f"failed to parse the request JSON buffer: {exc}"}
        if parts[2:] == ["index"]:
            ready_only = bool(body.get("ready", False)) if isinstance(body, dict) else False
            return 200, await self.manager.index(ready_only)
        if len(parts) == 5 and parts[2] == "models" and parts[4] in ("load", "unload"):
            try:
                await self._change(parts[4], parts[3], body)
            except ControlError as exc:
                return _STATUS.get(exc.code, 500), {"error": str(exc)}
            return 200, None
        return 404, {"error": "Not Found"}

    async def _change(self, action: str, name: str, body: Any) -> None:
        if not self.explicit:
            raise ControlError(NOT_EXPLICIT, ErrorCode.UNAVAILABLE)
        params = body.get("parameters", {}) if isinstance(body, dict) else {}
        if not isinstance(params, dict):
            raise ControlError("'parameters' must be a JSON object", ErrorCode.INVALID_ARG)
        if action == "unload":
            await self.manager.unload(name)
            return
        config = params.get("config", "")
        files: dict[str, bytes] = {}
        for key, value in params.items():
            if key.startswith("file:"):
                try:
                    files[key] = base64.b64decode(value, validate=True)
                except (binascii.Error, TypeError, ValueError):
                    raise ControlError(
                        f"failed to decode base64 content of '{key}'", ErrorCode.INVALID_ARG
                    ) from None
        await self.manager.load(name, config if isinstance(config, str) else "", files or None)


def _path_parts(target: bytes) -> list[str]:
    """The decoded segments of a request target's path: b"/v2/repository/index?x" gives
    ["v2", "repository", "index"]. Every check and the routing use these same segments."""
    path = target.decode("latin-1").split("?", 1)[0]
    try:
        return [unquote(p, errors="strict") for p in path.strip("/").split("/")]
    except UnicodeDecodeError:
        raise _Refused(400, "the request path is not valid UTF-8") from None


def _cut(text: bytes | str | None, limit: int = 200) -> str:
    """A client-chosen string for a log line: printable and short."""
    if isinstance(text, bytes):
        text = text.decode("latin-1")
    shown = repr(text or "")
    return shown if len(shown) <= limit else shown[:limit] + "..."


def _is_loopback_host(host: str) -> bool:
    """True for a Host header naming this machine: localhost, 127.x.y.z or [::1], any port."""
    name = host.strip().lower()
    if name.startswith("["):
        name = name[1:].partition("]")[0]
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    if name in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
