"""`--http-restricted-api` on the triton door's HTTP port, against the real Triton with the same
flags: which routes each group covers, and the refusal (403, `text/plain`, Triton's text) of a
request without its header or with a wrong value.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.differential.support import REPOSITORIES

pytestmark = pytest.mark.oracle

REPO = REPOSITORIES / "http_generate"
RESTRICTED = (
    "--http-restricted-api=health,inference,logging:infer-key=yes",
    "--http-restricted-api=model-repository,shared-memory,statistics,model-config,trace:admin-key=s3",
)
INFER = json.dumps({"inputs": [{"name": "A", "shape": [1, 1], "datatype": "INT32", "data": [1]}]})
ROUTES = [
    ("GET", "/v2/health/live", ""),
    ("GET", "/v2/health/ready", ""),
    ("GET", "/v2/models/shapes/ready", ""),
    ("GET", "/v2/models/shapes/versions/1/ready", ""),
    ("GET", "/v2", ""),
    ("GET", "/v2/models/shapes", ""),
    ("GET", "/v2/models/shapes/config", ""),
    ("GET", "/v2/models/shapes/stats", ""),
    ("GET", "/v2/models/stats", ""),
    ("POST", "/v2/models/shapes/infer", INFER),
    ("POST", "/v2/models/shapes/generate", '{"A":[1]}'),
    ("POST", "/v2/models/shapes/generate_stream", '{"A":[1]}'),
    ("POST", "/v2/repository/index", ""),
    ("POST", "/v2/repository/models/shapes/unload", ""),
    ("GET", "/v2/systemsharedmemory/status", ""),
    ("GET", "/v2/cudasharedmemory/status", ""),
    ("POST", "/v2/systemsharedmemory/unregister", ""),
    ("GET", "/v2/logging", ""),
    ("GET", "/v2/trace/setting", ""),
    ("GET", "/v2/models/shapes/trace/setting", ""),
    ("GET", "/v2/no/such/route", ""),
]
HEADERS = [
    {},
    {"infer-key": "no", "admin-key": "wrong"},
    {"Infer-Key": "yes"},
    {"admin-key": "s3"},
]


@pytest.fixture(scope="module")
def servers(oracle_server, shared_bridge_server) -> tuple[Any, Any]:
    return (
        oracle_server(REPO, *RESTRICTED),
        # Client shared memory on, as 2.51 has it (the newest Triton's default is off): these
        # tests compare the restricted API groups, which include its routes.
        shared_bridge_server(REPO, "--frontend=triton", "--allow-client-shm=true", *RESTRICTED),
    )


def outcome(url: str, method: str, path: str, body: str, headers: dict) -> tuple[Any, ...]:
    """The whole answer of a refusal; the status alone of anything else."""
    response = httpx.request(
        method, f"http://{url}{path}", content=body.encode(), headers=headers, timeout=60
    )
    if response.status_code != 403:
        return (response.status_code,)
    return response.status_code, response.headers.get("content-type"), response.text


@pytest.mark.parametrize("headers", HEADERS, ids=["none", "wrong", "infer-key", "admin-key"])
def test_restricted_groups_match_triton(servers, headers: dict) -> None:
    oracle, bridge = servers
    for method, path, body in ROUTES:
        triton = outcome(oracle.http_url, method, path, body, headers)
        assert outcome(bridge.http_url, method, path, body, headers) == triton, (path, headers)
