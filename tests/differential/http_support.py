"""Helpers for the HTTP differential tests: one HTTP request, Triton's HTTP port and the bridge's.

The bridge under test always runs the triton door (`--frontend triton`), which serves Triton's
HTTP/REST API on the harness's DYN_BRIDGE_HTTP_PORT; Dynamo's frontend has no such API. An
answer is compared whole: status, media type, the JSON document (parsed, so key order and
float spelling do not matter unless a test says so) and the binary data after it.

What the door answers differently from Triton on purpose is listed in `HTTP_DIFFERENCES`, and
each difference is applied by one named function (`expected_bridge_*`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from tests.differential.support import TRITON_DOOR
from tests.harness import BridgeServer, TritonOracle

# The bridge's arguments: the triton door (the default unless the suite runs its Dynamo pass;
# then the bridge process is not shared with the gRPC tests of the same repository).
DOOR_ARGS: tuple[str, ...] = () if TRITON_DOOR else ("--frontend", "triton")

HTTP_DIFFERENCES: dict[str, str] = {
    "parse_error_status": "a request that cannot be parsed (broken JSON, a value of the wrong "
    "JSON kind, a missing member) is 400 on the bridge; Triton answers 500 (its JSON parser's "
    "errors are INTERNAL), while the issue asks for a clear 400",
    "parse_error_text": "broken JSON: Triton's text names rapidjson's error and offset "
    "(`Invalid value. at 12`), the bridge's Python's (`Expecting value: line 1 column 13`); "
    "the prefix `failed to parse the request JSON buffer: ` is the same",
}


@dataclass(frozen=True)
class HttpPair:
    """Triton and the bridge (triton door) serving the same repository, over HTTP."""

    oracle: TritonOracle
    bridge: BridgeServer
    root: Path

    def servers(self) -> list[tuple[str, TritonOracle | BridgeServer]]:
        return [("triton", self.oracle), ("bridge", self.bridge)]


@dataclass(frozen=True)
class Answer:
    """An HTTP answer in a comparable form."""

    status: int
    media_type: str
    document: Any  # the JSON (header) part, parsed; None when the body is empty or not JSON
    binary: bytes = b""  # what followed the JSON header (binary tensor data)
    text: bytes = b""  # the body as sent when it was not JSON


def base_url(server: TritonOracle | BridgeServer) -> str:
    return f"http://{server.http_url}"


def parse_answer(response: httpx.Response) -> Answer:
    media_type = response.headers.get("content-type", "").split(";")[0].strip()
    body = response.content
    length = response.headers.get("inference-header-content-length")
    header, binary = (body[: int(length)], body[int(length) :]) if length else (body, b"")
    try:
        document = json.loads(header) if header else None
    except ValueError:
        return Answer(response.status_code, media_type, None, binary, header)
    return Answer(response.status_code, media_type, document, binary)


def send(
    server: TritonOracle | BridgeServer,
    method: str,
    path: str,
    content: bytes | None = None,
    headers: Mapping[str, str] | None = None,
) -> Answer:
    # Accept-Encoding identity: httpx asks for gzip by default, which both servers would honour.
    merged = {"accept-encoding": "identity", **(headers or {})}
    with httpx.Client(base_url=base_url(server), timeout=60) as client:
        return parse_answer(client.request(method, path, content=content, headers=merged))


def both(
    pair: HttpPair,
    method: str,
    path: str,
    content: bytes | None = None,
    headers: Mapping[str, str] | None = None,
) -> tuple[Answer, Answer]:
    """The same request to Triton and to the bridge: (triton answer, bridge answer)."""
    return (
        send(pair.oracle, method, path, content, headers),
        send(pair.bridge, method, path, content, headers),
    )


def infer_body(header: Mapping[str, Any], binary: bytes = b"") -> tuple[bytes, dict[str, str]]:
    """A request body (JSON header + binary data) and its Inference-Header-Content-Length."""
    text = json.dumps(header).encode()
    if not binary:
        return text, {}
    return text + binary, {"Inference-Header-Content-Length": str(len(text))}


def infer_both(
    pair: HttpPair, model: str, header: Mapping[str, Any], binary: bytes = b""
) -> tuple[Answer, Answer]:
    content, headers = infer_body(header, binary)
    return both(pair, "POST", f"/v2/models/{model}/infer", content, headers)


# -- known differences ----------------------------------------------------------------------------


def expected_bridge_parse_error(triton: Answer) -> Answer:
    """parse_error_status: Triton's 500 for a request it could not parse is 400 here."""
    assert triton.status in (400, 500), triton
    return replace(triton, status=400)


PARSE_PREFIX = "failed to parse the request JSON buffer: "


def expected_bridge_broken_json(triton: Answer, bridge: Answer) -> Answer:
    """parse_error_text: the same prefix, the rest is the parser's own words."""
    text = triton.document["error"]
    assert text.startswith(PARSE_PREFIX), text
    assert bridge.document["error"].startswith(PARSE_PREFIX), bridge
    return replace(expected_bridge_parse_error(triton), document=bridge.document)
