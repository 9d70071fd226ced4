"""`--grpc-header-forward-pattern` / `--http-header-forward-pattern` against Triton 2.51.

The model answers its `request.parameters()` as JSON, so what a client sees is what the model
saw. Compared on both wires (gRPC unary and stream, HTTP): which headers are forwarded (a
case-insensitive search of the name), that a header wins over a body parameter of the same name,
and the known difference of the HTTP wire's header case (bridge/frontends/triton/header_forward.py).
"""

from __future__ import annotations

import json
import queue

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.differential.http_support import DOOR_ARGS, HttpPair, base_url
from tests.differential.support import REPOSITORIES

pytestmark = pytest.mark.oracle

ROOT = REPOSITORIES / "header_forward"
PATTERNS = ("--grpc-header-forward-pattern=^x-tenant", "--http-header-forward-pattern=TENANT")


@pytest.fixture(scope="module")
def pair(oracle_server, shared_bridge_server) -> HttpPair:
    oracle = oracle_server(ROOT, *PATTERNS)
    return HttpPair(oracle, shared_bridge_server(ROOT, *PATTERNS, *DOOR_ARGS), ROOT)


def _input() -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    return tensor


def grpc_parameters(server, headers: dict, parameters: dict | None = None) -> dict:
    result = server.client().infer("params", [_input()], headers=headers, parameters=parameters)
    return json.loads(result.as_numpy("PARAMETERS")[0])


def stream_parameters(server, headers: dict) -> dict:
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(lambda result, error: answers.put((result, error)), headers=headers)
        client.async_stream_infer("params", [_input()])
        result, error = answers.get(timeout=30)
        assert error is None, error
        return json.loads(result.as_numpy("PARAMETERS")[0])
    finally:
        client.stop_stream()
        client.close()


def http_parameters(server, headers: list[tuple[str, str]], parameters: dict | None = None):
    body: dict = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]}]}
    if parameters:
        body["parameters"] = parameters
    url = f"{base_url(server)}/v2/models/params/infer"
    reply = httpx.post(url, json=body, headers=headers, timeout=30)
    assert reply.status_code == 200, reply.text
    return json.loads(reply.json()["outputs"][0]["data"][0])


def test_grpc_headers_reach_the_model(pair: HttpPair) -> None:
    seen = {
        name: (
            grpc_parameters(server, {"x-tenant-id": "acme", "other": "1"}),
            grpc_parameters(server, {"x-tenant-id": "hdr"}, {"x-tenant-id": "param", "n": 5}),
            stream_parameters(server, {"x-tenant-id": "streamed", "y-x-tenant": "no"}),
        )
        for name, server in pair.servers()
    }
    assert seen["triton"][0] == {"x-tenant-id": "acme"}
    assert seen["triton"][1] == {"x-tenant-id": "hdr", "n": 5}  # the header wins [V]
    assert seen["bridge"] == seen["triton"]


def test_http_headers_reach_the_model(pair: HttpPair) -> None:
    seen = {
        name: (
            http_parameters(server, [("my-tenant", "acme"), ("other", "1")]),
            http_parameters(server, [("tenant", "hdr")], {"tenant": "param"}),
            http_parameters(server, [("tenant", "a"), ("tenant", "b")]),
        )
        for name, server in pair.servers()
    }
    assert seen["triton"] == ({"my-tenant": "acme"}, {"tenant": "hdr"}, {"tenant": "b"})
    assert seen["bridge"] == seen["triton"]


def test_http_header_names_arrive_lower_case_on_the_bridge(pair: HttpPair) -> None:
    """The known difference: Triton keeps the case the client sent."""
    assert http_parameters(pair.oracle, [("My-Tenant", "x")]) == {"My-Tenant": "x"}
    assert http_parameters(pair.bridge, [("My-Tenant", "x")]) == {"my-tenant": "x"}


def test_without_a_pattern_nothing_is_forwarded(shared_bridge_server) -> None:
    bridge = shared_bridge_server(ROOT, *DOOR_ARGS)
    assert grpc_parameters(bridge, {"x-tenant-id": "acme"}) == {}
    assert http_parameters(bridge, [("tenant", "acme")]) == {}


def test_bls_callees_get_forwarded_headers_only_when_passed_on(pair: HttpPair) -> None:
    seen = {}
    for name, server in pair.servers():
        result = server.client().infer("bls_params", [_input()], headers={"x-tenant-id": "acme"})
        seen[name] = {
            output: json.loads(result.as_numpy(output)[0])
            for output in ("OWN", "CALLEE_PLAIN", "CALLEE_PASSED")
        }
    forwarded = {"x-tenant-id": "acme"}
    assert seen["triton"] == {"OWN": forwarded, "CALLEE_PLAIN": {}, "CALLEE_PASSED": forwarded}
    assert seen["bridge"] == seen["triton"]
