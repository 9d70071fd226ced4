"""The cap on clients' shared memory regions (`--max-shm-regions`; issue 38), over real gRPC and
HTTP with tritonclient: past it a registration is UNAVAILABLE on either wire (HTTP 503) with the
door's text, the regions already registered stay, and unregistering one, over either wire,
frees its slot. Triton has no cap; without one a client could hold a descriptor per region
until the door had none left for connections.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.harness import BridgeServer

CAP = 3


@pytest.fixture(scope="module")
def door(shared_bridge_server, repository) -> BridgeServer:
    return shared_bridge_server(
        repository("dtypes"),
        "--frontend",
        "triton",
        "--allow-client-shm",
        "--max-shm-regions",
        str(CAP),
    )


@pytest.fixture
def objects() -> Iterator[list[str]]:
    """Keys of fresh /dev/shm objects: CAP + 1 of them, destroyed afterwards."""
    handles = []
    keys = []
    for _ in range(CAP + 1):
        key = f"/bridge_e2e_cap_{uuid.uuid4().hex}"
        handles.append(shm.create_shared_memory_region(key[1:], key, 4096))
        keys.append(key)
    yield keys
    for handle in handles:
        shm.destroy_shared_memory_region(handle)


def names(client: Any) -> set[str]:
    status = client.get_system_shared_memory_status()
    if isinstance(client, httpclient.InferenceServerClient):
        return {region["name"] for region in status}
    return set(status.regions)


def test_past_the_cap_either_wire_is_refused_until_a_region_goes(door, objects):
    grpc = grpcclient.InferenceServerClient(door.grpc_url)
    http = httpclient.InferenceServerClient(door.http_url)
    try:
        # The regions of one door, whichever wire registered them.
        grpc.register_system_shared_memory("r0", objects[0], 4096)
        http.register_system_shared_memory("r1", objects[1], 4096)
        grpc.register_system_shared_memory("r2", objects[2], 4096)
        for client, unavailable in ((grpc, "StatusCode.UNAVAILABLE"), (http, "503")):
            with pytest.raises(InferenceServerException) as caught:
                client.register_system_shared_memory("past", objects[3], 4096)
            assert str(caught.value.status()) == unavailable
            assert caught.value.message() == (
                "failed to register shared memory region 'past': the server holds "
                f"{CAP} shared memory regions, its limit (--max-shm-regions); "
                "unregister one first"
            )
        assert names(grpc) == names(http) == {"r0", "r1", "r2"}
        http.unregister_system_shared_memory("r0")
        grpc.register_system_shared_memory("past", objects[3], 4096)
        grpc.unregister_system_shared_memory("r1")
        http.register_system_shared_memory("again", objects[0], 4096)
        assert names(http) == {"r2", "past", "again"}
    finally:
        grpc.unregister_system_shared_memory()
        grpc.close()
        http.close()
