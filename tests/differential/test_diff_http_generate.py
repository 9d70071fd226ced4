"""Triton's generate extension over HTTP (`/generate`, `/generate_stream`): the bridge's triton
door and the real Triton answer the same raw requests alike.

Each case is posted to both as raw bytes with httpx (tritonclient.http has no generate call);
the status, the Content-Type and the body (JSON, or the list of Server-Sent Events) must be
equal. The models are tests/repositories/http_generate (see its README). One difference is
named: a body that is not JSON at all is refused alike but worded by a different parser
(`JSON_PARSER_WORDS`).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.differential.support import REPOSITORIES, Pair

pytestmark = pytest.mark.oracle

REPO = REPOSITORIES / "http_generate"
# The JSON parser's own words after this prefix differ (RapidJSON's vs Python's).
JSON_PARSER_WORDS = "failed to parse the request JSON buffer: "

T = "/v2/models/types/generate"
TYPES_OK = '"I_BOOL":true,"I_U8":1,"I_I64":1,"I_F16":1,"I_F64":1,"I_STR":"x"'

CASES: list[tuple[str, str]] = [
    # shapes from JSON values
    ("/v2/models/shapes/generate", '{"A":[1,2,3]}'),
    ("/v2/models/shapes/generate", '{"A":5}'),
    ("/v2/models/shapes/generate", '{"A":[]}'),
    ("/v2/models/shapes/generate", '{"A":[1,2],"B":[1,2,3,4]}'),
    ("/v2/models/shapes/generate", '{"A":[1,2],"B":[1,2,3]}'),
    ("/v2/models/shapes/generate", '{"A":[1,2],"C":[1,2,3,4,5,6]}'),
    ("/v2/models/shapes/generate", '{"A":[[1,2]]}'),
    # members that are no input are parameters
    ("/v2/models/shapes/generate", '{"A":[1],"EXTRA":{"x":1},"model_name":"zz"}'),
    ("/v2/models/shapes/generate", '{"A":[1],"EXTRA":"s","E2":true,"E3":7,"E4":1.5}'),
    ("/v2/models/shapes/generate", '{"parameters":{"q":[1]},"A":[1],"EXTRA":[1]}'),
    ("/v2/models/shapes/generate", '{"EXTRA":[1],"parameters":5}'),
    ("/v2/models/shapes/generate", '{"EXTRA":[1],"id":5}'),
    ("/v2/models/shapes/generate", '{"A":"x","EXTRA":[1]}'),
    ("/v2/models/shapes/generate", '{"EXTRA":18446744073709551615,"A":[1]}'),
    ("/v2/models/batched/generate", '{"X":[1,2,3]}'),
    ("/v2/models/batched/generate", '{"X":7}'),
    # every JSON datatype, and values of the wrong JSON type
    (
        T,
        '{"I_BOOL":[true,false],"I_U8":[1,255],"I_I64":[-5,9007199254740993],"I_F16":[1.5,2],'
        '"I_F64":[0.1,1e300],"I_STR":["a","é"]}',
    ),
    (T, '{"I_BOOL":true,"I_U8":256,"I_I64":1,"I_F16":1,"I_F64":1,"I_STR":"x"}'),
    (T, '{"I_BOOL":1,"I_U8":1,"I_I64":1,"I_F16":1,"I_F64":1,"I_STR":"x"}'),
    (T, '{"I_BOOL":true,"I_U8":-1,"I_I64":1,"I_F16":1,"I_F64":1,"I_STR":"x"}'),
    (T, '{"I_BOOL":true,"I_U8":1,"I_I64":1.0,"I_F16":1,"I_F64":1,"I_STR":"x"}'),
    (T, '{"I_BOOL":true,"I_U8":1,"I_I64":1,"I_F16":1,"I_F64":null,"I_STR":"x"}'),
    (T, '{"I_BOOL":true,"I_U8":1,"I_I64":1,"I_F16":1,"I_F64":1,"I_STR":{"a":1}}'),
    ("/v2/models/halves/generate", '{"H":[1.5]}'),
    # id and parameters
    (T, "{" + TYPES_OK + ',"id":"abc"}'),
    (T, "{" + TYPES_OK + ',"id":5}'),
    (T, "{" + TYPES_OK + ',"parameters":5}'),
    (T, "{" + TYPES_OK + ',"parameters":{"a":[1]}}'),
    (T, "{" + TYPES_OK + ',"parameters":{"a":null}}'),
    (T, "{" + TYPES_OK + ',"parameters":{"a":1,"b":"s","c":true,"d":1.5}}'),
    (T, "{" + TYPES_OK + ',"I_F64":2}'),
    (T, "{" + TYPES_OK + ',"I_F64":2,"id":"q"}'),
    # bodies that are not a request
    (T, "[1]"),
    (T, ""),
    (T, '{"I_BOOL":true'),
    # which model, which version
    ("/v2/models/nope/generate", "{}"),
    ("/v2/models/nope/generate_stream", "{}"),
    ("/v2/models/types/versions/1/generate", "{" + TYPES_OK + "}"),
    ("/v2/models/types/versions/2/generate", "{" + TYPES_OK + "}"),
    ("/v2/models/types/versions/2/generate_stream", "{" + TYPES_OK + "}"),
    ("/v2/models/types/versions/x/generate", "{" + TYPES_OK + "}"),
    ("/v2/models/types/generate", '{"I_BOOL":true}'),
    ("/v2/models/types/generate_stream", '{"I_BOOL":true}'),
    # response counts, streams and errors
    ("/v2/models/count/generate", '{"N":1}'),
    ("/v2/models/count/generate", '{"N":3}'),
    ("/v2/models/count/generate", '{"N":0}'),
    ("/v2/models/count/generate_stream", '{"N":3}'),
    ("/v2/models/count/generate_stream", '{"N":0}'),
    ("/v2/models/types/generate_stream", "{" + TYPES_OK + "}"),
    ("/v2/models/midfail/generate_stream", '{"N":1}'),
    ("/v2/models/midfail/generate_stream", '{"N":0}'),
    ("/v2/models/midfail/generate", '{"N":0}'),
    ("/v2/models/erronly/generate", '{"N":0}'),
    ("/v2/models/erronly/generate_stream", '{"N":0}'),
]


@pytest.fixture(scope="module")
def pair(oracle_server, shared_bridge_server) -> Pair:
    return Pair(oracle_server(REPO), shared_bridge_server(REPO, "--frontend=triton"), REPO)


def answer(url: str, path: str, body: str) -> tuple[int, str, Any]:
    """(status, Content-Type, body): JSON parsed, an event stream as its list of events."""
    response = httpx.post(f"http://{url}{path}", content=body.encode(), timeout=60)
    content_type = response.headers.get("content-type", "")
    if content_type.startswith("text/event-stream"):
        events = [e for e in response.text.split("\n\n") if e.strip()]
        assert all(e.startswith("data: ") for e in events), response.text
        return response.status_code, content_type, [json.loads(e[6:]) for e in events]
    try:
        return response.status_code, content_type, json.loads(response.text)
    except ValueError:
        return response.status_code, content_type, response.text


def comparable(outcome: tuple[int, str, Any]) -> tuple[int, str, Any]:
    status, content_type, body = outcome
    content_type = content_type.removesuffix("; charset=utf-8") if status == 404 else content_type
    if isinstance(body, dict) and str(body.get("error", "")).startswith(JSON_PARSER_WORDS):
        body = {"error": JSON_PARSER_WORDS + "<the parser's words>"}
    return status, content_type, body


@pytest.mark.parametrize(("path", "body"), CASES, ids=[f"{p[10:]} {b[:40]}" for p, b in CASES])
def test_generate_matches_triton(pair: Pair, path: str, body: str) -> None:
    triton = comparable(answer(pair.oracle.http_url, path, body))
    bridge = comparable(answer(pair.bridge.http_url, path, body))
    assert bridge == triton
