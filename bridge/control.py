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
with 400 (INVALID_ARG), 500 (INTERNAL) or 503 (UNAVAILABLE). stdlib only: one request per
connection, no keep-alive, which is all a control channel needs.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
from typing import Any
from urllib.parse import unquote

from .manager import NOT_EXPLICIT, ControlError, ModelManager

log = logging.getLogger("dynamo_bridge")

_STATUS = {"INVALID_ARG": 400, "NOT_FOUND": 404, "INTERNAL": 500, "UNAVAILABLE": 503}
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Payload Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
_MAX_BODY = 256 * 1024 * 1024  # a model's files travel in the body of a load


class ControlServer:
    """Serves the repository API above for `manager`; `explicit` allows load and unload."""

    def __init__(self, manager: ModelManager, port: int, explicit: bool) -> None:
        self.manager = manager
        self.port = port
        self.explicit = explicit
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", self.port)
        log.info("model control (repository API) on http://127.0.0.1:%d", self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            status, body = await self._request(reader)
        except Exception as exc:  # a malformed request must not end the server
            status, body = 400, {"error": f"bad request: {exc}"}
        # Compact, as Triton writes it.
        payload = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
            "Connection: close\r\n\r\n"
        )
        try:
            writer.write(head.encode() + payload)
            await writer.drain()
        finally:
            writer.close()

    async def _request(self, reader: asyncio.StreamReader) -> tuple[int, Any]:
        request_line = (await reader.readline()).decode("latin-1").strip()
        method, target, _version = request_line.split(" ", 2)
        length = 0
        while line := (await reader.readline()).decode("latin-1").strip():
            key, _, value = line.partition(":")
            if key.strip().lower() == "content-length":
                length = int(value.strip())
        if length > _MAX_BODY:
            return 413, {"error": "request body too large"}
        raw = await reader.readexactly(length) if length else b""
        return await self.handle(method, target.split("?", 1)[0], raw)

    async def handle(self, method: str, path: str, raw: bytes) -> tuple[int, Any]:
        """(status, JSON body or None) for one request."""
        parts = [unquote(p) for p in path.strip("/").split("/")]
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
            raise ControlError(NOT_EXPLICIT, "UNAVAILABLE")
        params = body.get("parameters", {}) if isinstance(body, dict) else {}
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
                        f"failed to decode base64 content of '{key}'", "INVALID_ARG"
                    ) from None
        await self.manager.load(name, config if isinstance(config, str) else "", files or None)
