"""`/v2/logging` and `/v2/trace/setting` (server and per model) on the triton door's HTTP port,
against the real Triton: the same requests in the same order get the same status, Content-Type and
body. The calls end with the settings back at their start (the servers are shared).
A trace level other than OFF is refused by both with no trace file configured (400, "trace
file name is not given").
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.differential.support import REPOSITORIES

pytestmark = pytest.mark.oracle

REPO = REPOSITORIES / "http_generate"
JSON_PARSER_WORDS = "failed to parse the request JSON buffer: "
CALLS: list[tuple[str, str, str]] = [
    ("GET", "/v2/logging", ""),
    ("POST", "/v2/logging", "{}"),
    ("POST", "/v2/logging", ""),
    ("POST", "/v2/logging", "[1]"),
    ("POST", "/v2/logging", '{"log_verbose_level":1,"log_info":null}'),
    ("POST", "/v2/logging", '{"log_verbose_level":"x"}'),
    ("POST", "/v2/logging", '{"log_info":1}'),
    ("POST", "/v2/logging", '{"log_file":"x"}'),
    ("POST", "/v2/logging", '{"zzz":1,"log_verbose_level":0}'),
    ("POST", "/v2/logging", '{"log_format":"ISO8601"}'),
    ("POST", "/v2/logging", '{"log_format":"default","log_warning":false}'),
    ("POST", "/v2/logging", '{"log_warning":true,"log_error":"no","log_verbose_level":2}'),
    ("GET", "/v2/logging", ""),
    ("POST", "/v2/logging", '{"log_format":"nope"}'),
    ("POST", "/v2/logging", '{"log_verbose_level":-1}'),
    ("POST", "/v2/logging", '{"log_verbose_level":4294967297}'),
    ("POST", "/v2/logging", '{"log_verbose_level":0,"log_error":true,"log_warning":true}'),
    ("PUT", "/v2/logging", ""),
    ("GET", "/v2/trace/setting", ""),
    ("POST", "/v2/trace/setting", "{}"),
    ("POST", "/v2/trace/setting", ""),
    ("POST", "/v2/trace/setting", "[1]"),
    ("POST", "/v2/trace/setting", '{"trace_rate":"5"}'),
    ("POST", "/v2/trace/setting", '{"trace_rate":5}'),
    ("POST", "/v2/trace/setting", '{"trace_rate":["5"]}'),
    ("POST", "/v2/trace/setting", '{"trace_rate":null}'),
    ("POST", "/v2/trace/setting", '{"trace_level":"OFF"}'),
    ("POST", "/v2/trace/setting", '{"trace_level":["OFF"],"log_frequency":"3"}'),
    ("POST", "/v2/trace/setting", '{"trace_file":"x"}'),
    ("POST", "/v2/trace/setting", '{"trace_level":["TIMESTAMPS"]}'),
    ("POST", "/v2/models/shapes/trace/setting", '{"trace_level":["TENSORS"],"trace_rate":"3"}'),
    ("POST", "/v2/trace/setting", '{"trace_count":"x"}'),
    ("POST", "/v2/trace/setting", '{"zzz":"1"}'),
    ("POST", "/v2/trace/setting", '{"zzz":1}'),
    ("GET", "/v2/models/shapes/trace/setting", ""),
    ("POST", "/v2/models/shapes/trace/setting", '{"trace_count":"7"}'),
    ("GET", "/v2/models/shapes/trace/setting", ""),
    ("GET", "/v2/trace/setting", ""),
    ("GET", "/v2/models/nope/trace/setting", ""),
    ("POST", "/v2/models/nope/trace/setting", '{"trace_count":"7"}'),
    ("GET", "/v2/models/shapes/versions/1/trace/setting", ""),
    ("POST", "/v2/models/shapes/trace/setting", '{"trace_count":null}'),
    ("POST", "/v2/trace/setting", '{"trace_rate":null,"log_frequency":null}'),
    ("PUT", "/v2/trace/setting", ""),
]


def answer(url: str, method: str, path: str, body: str) -> tuple[int, str, Any]:
    response = httpx.request(method, f"http://{url}{path}", content=body.encode(), timeout=60)
    try:
        parsed: Any = json.loads(response.text) if response.text else None
    except ValueError:
        parsed = response.text
    if isinstance(parsed, dict) and str(parsed.get("error", "")).startswith(JSON_PARSER_WORDS):
        parsed = {"error": JSON_PARSER_WORDS + "<the parser's words>"}  # RapidJSON's vs Python's
    return response.status_code, response.headers.get("content-type", ""), parsed


def test_settings_match_triton(oracle_server, shared_bridge_server) -> None:
    oracle, bridge = oracle_server(REPO), shared_bridge_server(REPO, "--frontend=triton")
    for method, path, body in CALLS:
        triton = answer(oracle.http_url, method, path, body)
        assert answer(bridge.http_url, method, path, body) == triton, (method, path, body)
