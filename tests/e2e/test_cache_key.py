"""The response cache keys header-forwarded parameters apart (issue 38, finding 6), over real
gRPC and HTTP: with `--grpc-header-forward-pattern` / `--http-header-forward-pattern`, a tenant
header reaches the model as a request parameter, so one tenant's cached answer must never be
served to another (Triton 2.51 serves it: its key ignores parameters).
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.harness import BridgeServer


@pytest.fixture(scope="module")
def server(shared_bridge_server, repository) -> BridgeServer:
    return shared_bridge_server(
        repository("response_cache"),
        "--cache-config=local,size=1048576",
        "--grpc-header-forward-pattern=x-tenant",
        "--http-header-forward-pattern=x-tenant",
    )


@pytest.mark.parametrize("wire", ["grpc", "http"])
def test_one_tenants_cached_answer_is_not_anothers(server: BridgeServer, wire: str) -> None:
    module, url = (grpcclient, server.grpc_url) if wire == "grpc" else (httpclient, server.http_url)
    client = module.InferenceServerClient(url)
    value = np.array([11.0 if wire == "grpc" else 12.0], dtype=np.float32)

    def executions(tenant: str) -> int:
        tensor = module.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(value)
        result = client.infer("cached", [tensor], headers={"x-tenant": tenant})
        return int(result.as_numpy("EXECUTIONS")[0])

    a = executions("a")
    assert executions("a") == a  # a hit for the same tenant
    b = executions("b")
    assert b == a + 1  # tenant b's request ran the model
    assert executions("b") == b
