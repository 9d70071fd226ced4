"""Start-up: the status table, liveness and readiness, as a Triton user sees them."""

from __future__ import annotations

import numpy as np

from tests.e2e.support import SERVING, fp32_input, status_rows
from tests.e2e.test_load_failures import http_status

SERVING_MODELS = ["chatty", "echo", "flaky", "pool", "reply_params"]


def test_status_table_lists_every_model_ready(shared_bridge_server) -> None:
    server = shared_bridge_server(SERVING)
    rows = status_rows(server.log_text)
    assert rows == {name: [("1", "READY")] for name in SERVING_MODELS}


def test_server_live_and_ready(shared_bridge_server) -> None:
    server = shared_bridge_server(SERVING)
    client = server.client()
    assert client.is_server_live()
    assert client.is_server_ready()
    assert "Not ready:" not in server.log_text  # no readiness note under the table
    # Triton's HTTP health paths, on the metrics port.
    assert http_status(server, "/v2/health/ready") == 200
    assert http_status(server, "/v2/health/live") == 200


def test_every_model_ready(shared_bridge_server) -> None:
    client = shared_bridge_server(SERVING).client()
    for name in SERVING_MODELS:
        assert client.is_model_ready(name), name
        assert client.is_model_ready(name, "1"), name


def test_unknown_model_not_ready(shared_bridge_server) -> None:
    client = shared_bridge_server(SERVING).client()
    assert not client.is_model_ready("no_such_model")


def test_first_request_after_start_is_answered(bridge_server) -> None:
    # A fresh process: the very first request right after ServerLive must already work.
    server = bridge_server(SERVING)
    result = server.client().infer("echo", [fp32_input([1.0, 2.0])])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.array([1, 2], np.float32))
