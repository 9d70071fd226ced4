"""Triton's error codes → HTTP statuses, and the `{"error": text}` body of every refusal.

Triton 2.51's HTTP server answers a failed call with one status per error code and Triton's
text in a JSON object [V]: INVALID_ARG, UNKNOWN, ALREADY_EXISTS and CANCELLED are 400 Bad
Request, NOT_FOUND 404, INTERNAL 500, UNSUPPORTED 501, UNAVAILABLE 503. The HTTP door maps
here, and nowhere else.
"""

from __future__ import annotations

import json

from starlette.responses import Response

from model_repository_loader.pb_utils.errors import ErrorCode

from ..status import DoorError

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


def json_response(document: object, status: int = 200) -> Response:
    """A compact JSON body, as Triton writes it (no spaces)."""
    text = json.dumps(document, separators=(",", ":"), ensure_ascii=False)
    return Response(text.encode(), status_code=status, media_type="application/json")


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}, separators=(",", ":"), ensure_ascii=False).encode()


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
