"""Client shared memory is off unless `--allow-client-shm` (Triton 2.70 on; issue 40 item 4).

As the newest qa/L0_shared_memory `test_client_shm_disabled_by_default` checks: registering and
unregistering, system or CUDA, are refused with Triton's UNSUPPORTED text on both wires, and the
status still answers (empty). With the flag, regions register as before (test_triton_door.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.harness import BridgeServer

DISABLED = "Client shared memory is disabled. Start the server with '--allow-client-shm=true'"


@pytest.fixture(scope="module")
def door(shared_bridge_server, repository) -> BridgeServer:
    return shared_bridge_server(repository("dtypes"), "--frontend", "triton")


def client_of(door: BridgeServer, wire: Any) -> Any:
    return wire.InferenceServerClient(door.grpc_url if wire is grpcclient else door.http_url)


@pytest.mark.parametrize("wire", [grpcclient, httpclient], ids=["grpc", "http"])
def test_registration_is_refused_by_default(door: BridgeServer, wire: Any) -> None:
    region = shm.create_shared_memory_region("dummy_data", "/bridge_dummy_data", 8)
    client = client_of(door, wire)
    try:
        calls = [
            lambda: client.register_system_shared_memory("dummy_data", "/bridge_dummy_data", 8),
            lambda: client.unregister_system_shared_memory("dummy_data"),
            lambda: client.register_cuda_shared_memory("cuda", b"\0" * 64, 0, 8),
            lambda: client.unregister_cuda_shared_memory("cuda"),
        ]
        for call in calls:
            with pytest.raises(InferenceServerException, match=DISABLED) as failure:
                call()
            assert failure.value.status() in ("501", "StatusCode.UNIMPLEMENTED")  # UNSUPPORTED
        status = client.get_system_shared_memory_status()
        assert (len(status) if wire is httpclient else len(status.regions)) == 0
    finally:
        shm.destroy_shared_memory_region(region)
