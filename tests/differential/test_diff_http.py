"""Triton's HTTP/REST API on the triton door, compared with real Triton's HTTP port: health,
readiness, server and model metadata, model config, statistics, and the paths and methods
Triton does not serve. Inference is in test_diff_http_infer.py.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.differential.http_support import HTTP_DIFFERENCES, Answer, HttpPair, both, send
from tests.differential.support import model_names

pytestmark = pytest.mark.oracle


def _paths(model: str) -> list[str]:
    return [f"/v2/models/{model}", f"/v2/models/{model}/versions/1"]


# -- health ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/v2/health/live",
        "/v2/health/ready",
        "/v2/models/identity_fp32/ready",
        "/v2/models/identity_fp32/versions/1/ready",
        "/v2/models/identity_fp32/versions/7/ready",
        "/v2/models/no_such_model/ready",
        "/v2/models/identity_fp32/versions/abc/ready",
    ],
)
def test_health_and_readiness(http_dtypes: HttpPair, path: str):
    """Status, body and media type as Triton: 200 empty, or 400 `Model version not ready`, or
    404 where Triton matches no route (a version that is not a number)."""
    triton, bridge = both(http_dtypes, "GET", path)
    assert bridge == triton


def test_readiness_answers_are_empty_text(http_dtypes: HttpPair):
    """Guards the comparison above: live is 200 with an empty text/plain body on both."""
    triton, bridge = both(http_dtypes, "GET", "/v2/health/live")
    assert triton == Answer(200, "text/plain", None) == bridge


# -- metadata and config --------------------------------------------------------------------------


def test_server_metadata(http_dtypes: HttpPair):
    """Triton's name and version, and only extensions Triton has."""
    triton, bridge = both(http_dtypes, "GET", "/v2")
    assert bridge.status == triton.status == 200
    assert list(bridge.document) == list(triton.document) == ["name", "version", "extensions"]
    assert bridge.document["name"] == triton.document["name"]
    assert bridge.document["version"] == triton.document["version"]
    assert set(bridge.document["extensions"]) <= set(triton.document["extensions"])


@pytest.mark.parametrize("suffix", ["", "/config"])
@pytest.mark.parametrize("fixture", ["http_dtypes", "http_introspect"])
def test_model_metadata_and_config_byte_for_byte(request, fixture: str, suffix: str):
    """Every model's metadata and config: the very bytes Triton sends (field order, 64-bit
    integers as numbers, every default field printed), with and without a version."""
    pair: HttpPair = request.getfixturevalue(fixture)
    checked = 0
    for model in model_names(pair.root):
        for path in _paths(model):
            with httpx.Client(headers={"accept-encoding": "identity"}) as client:
                triton = client.get(f"http://{pair.oracle.http_url}{path}{suffix}")
                bridge = client.get(f"http://{pair.bridge.http_url}{path}{suffix}")
            assert (bridge.status_code, bridge.content) == (triton.status_code, triton.content), (
                model,
                path,
            )
            checked += triton.status_code == 200
    assert checked >= 10


@pytest.mark.parametrize(
    "path",
    [
        "/v2/models/no_such_model",
        "/v2/models/no_such_model/config",
        "/v2/models/identity_fp32/versions/7",
        "/v2/models/identity_fp32/versions/7/config",
        "/v2/models/identity_fp32/versions/00001",
    ],
)
def test_metadata_errors(http_dtypes: HttpPair, path: str):
    triton, bridge = both(http_dtypes, "GET", path)
    assert bridge == triton


# -- statistics -----------------------------------------------------------------------------------


def _stats_shape(document: dict) -> list:
    """Keys in order, at every level, of each model's statistics (counts and times differ)."""

    def shape(value):
        if isinstance(value, dict):
            return [(key, shape(item)) for key, item in value.items()]
        if isinstance(value, list):
            # The distinct shapes of a list's items, not their number: the oracle is shared with
            # the gRPC tests, so its batch_stats may have rows for batch sizes this server's
            # traffic never had (the suite's order decides).
            return sorted({repr(shape(item)) for item in value})
        return type(value).__name__

    def rows_of(stats: dict) -> dict:
        # Only identity_int32 had the same traffic on both servers here; the others' batch
        # rows depend on what other tests sent to the shared servers before.
        if stats["name"] == "identity_int32":
            return stats
        return {key: [] if key == "batch_stats" else value for key, value in stats.items()}

    return [(s["name"], s["version"], shape(rows_of(s))) for s in document["model_stats"]]


@pytest.mark.parametrize(
    "path",
    [
        "/v2/models/stats",
        "/v2/models/identity_int32/stats",
        "/v2/models/identity_int32/versions/1/stats",
    ],
)
def test_statistics_shape(http_dtypes: HttpPair, path: str):
    """The same fields in the same order, as JSON numbers, after inferences on both (a batch
    of 1 and of 2, so batch_stats has rows)."""
    for server in (http_dtypes.oracle, http_dtypes.bridge):
        for rows in (1, 2):
            body = {
                "inputs": [
                    {"name": "INPUT0", "shape": [rows, 1], "datatype": "INT32", "data": [1] * rows}
                ]
            }
            path_infer = "/v2/models/identity_int32/infer"
            assert send(server, "POST", path_infer, json.dumps(body).encode()).status == 200
    triton, bridge = both(http_dtypes, "GET", path)
    assert bridge.status == triton.status == 200
    assert _stats_shape(bridge.document) == _stats_shape(triton.document)
    counts = {s["name"]: s["inference_count"] for s in bridge.document["model_stats"]}
    assert counts["identity_int32"] >= 3


@pytest.mark.parametrize(
    "path", ["/v2/models/no_such_model/stats", "/v2/models/identity_int32/versions/3/stats"]
)
def test_statistics_errors(http_dtypes: HttpPair, path: str):
    triton, bridge = both(http_dtypes, "GET", path)
    assert triton.status == 400
    assert bridge == triton


# -- routes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method,path",
    [
        ("GET", "/v2/nothing"),
        ("GET", "/"),
        ("GET", "/v2/models/identity_fp32/infer"),
        ("POST", "/v2/health/live"),
        ("PUT", "/v2/models/identity_fp32/config"),
        ("HEAD", "/v2/health/live"),
        ("GET", "/v2/health/live/"),
        ("GET", "/v2/models/identity_fp32/"),
        ("GET", "/v2/models/identity%5Ffp32"),
        ("POST", "/v2/models/identity%5Ffp32/infer"),
    ],
)
def test_paths_and_methods_triton_does_not_serve(http_dtypes: HttpPair, method: str, path: str):
    triton, bridge = both(http_dtypes, method, path)
    assert triton.status in (404, 405)
    assert bridge == triton


def test_every_http_difference_is_asserted_by_a_test():
    """Each entry of HTTP_DIFFERENCES is applied by a named function some test calls."""
    import tests.differential.test_diff_http_infer as infer_tests

    source = open(infer_tests.__file__).read()
    assert "expected_bridge_parse_error" in source
    assert "expected_bridge_broken_json" in source
    assert set(HTTP_DIFFERENCES) == {"parse_error_status", "parse_error_text"}
