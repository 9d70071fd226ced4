"""Triton's error codes → HTTP statuses, and the `{"error": text}` body of every refusal.

Triton 2.51's HTTP server answers a failed call with one status per error code and Triton's
text in a JSON object [V]: INVALID_ARG, UNKNOWN, ALREADY_EXISTS and CANCELLED are 400 Bad
Request, NOT_FOUND 404, INTERNAL 500, UNSUPPORTED 501, UNAVAILABLE 503. The HTTP door maps
here, and nowhere else.

Every JSON body the door writes is encoded by `encode_json`, which never raises on text that
is not valid Unicode: a byte the request held that was not UTF-8 (read with surrogateescape)
goes back out as that byte, as Triton echoes it, and a lone surrogate (a `"\ud800"` escape in a
request's name or id) as the JSON escape it came in as. Such a name is then the client's 400,
not a 500 and a traceback.
"""

from __future__ import annotations

import codecs
import json

from starlette.responses import Response

from model_repository_loader.pb_utils.errors import ErrorCode

from ..door_error import DoorError

HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.UNKNOWN: 400,
    ErrorCode.INVALID_ARG: 400,
    ErrorCode.ALREADY_EXISTS: 400,
    ErrorCode.CANCELLED: 400,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.INTERNAL: 500,
    ErrorCode.UNSUPPORTED: 501,
    ErrorCode.UNAVAILABLE: 503,
}


def http_status(code: ErrorCode) -> int:
    return HTTP_STATUS.get(code, 500)


_SURROGATES = "dynamo_bridge.json_surrogates"


def _write_surrogates(error: UnicodeError) -> tuple[bytes, int]:
    if not isinstance(error, UnicodeEncodeError):
        raise error
    out = bytearray()
    for char in error.object[error.start : error.end]:
        code = ord(char)
        if 0xDC80 <= code <= 0xDCFF:  # surrogateescape's stand-in for a byte
            out.append(code - 0xDC00)
        else:
            out += f"\\u{code:04x}".encode()
    return bytes(out), error.end


codecs.register_error(_SURROGATES, _write_surrogates)


def encode_json(document: object) -> bytes:
    """A compact JSON body, as Triton writes it (no spaces, UTF-8 unescaped), whatever its
    strings hold (module docstring)."""
    text = json.dumps(document, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8", _SURROGATES)


def json_response(document: object, status: int = 200) -> Response:
    return Response(encode_json(document), status_code=status, media_type="application/json")


def error_body(message: str) -> bytes:
    return encode_json({"error": message})


def error_response(error: DoorError, media_type: str = "application/json") -> Response:
    """A DoorError as Triton's HTTP server answers it: its status and `{"error": text}`
    (Triton labels a few of them `text/plain`)."""
    status = http_status(error.code)
    return Response(error_body(error.message), status_code=status, headers=_type(media_type))


def error_response_body(body: bytes, status: int) -> Response:
    return Response(body, status_code=status, headers=_type("application/json"))


def plain(body: bytes, status: int) -> Response:
    """A `text/plain` answer as Triton labels it: no charset (Starlette would add one)."""
    return Response(body, status_code=status, headers=_type("text/plain"))


def _type(media_type: str) -> dict[str, str]:
    return {"content-type": media_type}


def bad_request(message: str) -> Response:
    return error_response(DoorError(ErrorCode.INVALID_ARG, message))
