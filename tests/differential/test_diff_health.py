"""Triton's HTTP health paths: the oracle's HTTP port against the bridge's metrics port.

Dynamo's frontend answers gRPC ServerReady true while a model failed to load
(`server_ready_with_failures`); the metrics port, which the bridge serves itself, answers
Triton's `GET /v2/health/ready` strictly, as Triton's HTTP port does.
"""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from tests.differential.support import Pair

pytestmark = pytest.mark.oracle

PATHS = ["/v2/health/ready", "/v2/health/live"]


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def both(pair: Pair, path: str) -> tuple[tuple[int, bytes], tuple[int, bytes]]:
    triton = get(f"http://{pair.oracle.http_url}{path}")
    bridge = get(f"http://127.0.0.1:{pair.bridge.metrics_port}{path}")
    return triton, bridge


@pytest.mark.parametrize("path", PATHS)
def test_health_with_a_failed_model(load_failures: Pair, path: str):
    triton, bridge = both(load_failures, path)
    assert triton == ((400, b"") if path.endswith("ready") else (200, b""))
    assert bridge == triton


@pytest.mark.parametrize("path", PATHS)
def test_health_with_every_model_ready(examples: Pair, path: str):
    triton, bridge = both(examples, path)
    assert triton == (200, b"")
    assert bridge == triton
