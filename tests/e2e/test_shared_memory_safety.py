"""System shared memory on the triton door, over real gRPC and HTTP with tritonclient, as a
client that means harm uses it (issue 22, findings 1 and 8).

- A key is an shm_open name: a `../..` key to a file outside /dev/shm, a symlink in /dev/shm to
  such a file, a key with an inner `/` are refused with Triton's INTERNAL "Unable to open
  shared memory region" (HTTP 500), and the file is untouched.
- A client that truncates its object after registration gets Triton's INVALID_ARG "Invalid
  offset + byte size" for an input or an output in it, and the server keeps serving. (Before
  the fix, the first such request killed the server with SIGBUS; real Triton dies too.)
"""

from __future__ import annotations

import base64
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.harness import BridgeServer
from tests.harness.gpu import cuda_usable

SHM = Path("/dev/shm")
SECRET = b"not for clients " * 8
FOUR = np.arange(4, dtype=np.float32).reshape(1, 4)
WIRES = ("grpc", "http")

pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm on this host")


@pytest.fixture(scope="module")
def door(shared_bridge_server, repository) -> BridgeServer:
    return shared_bridge_server(repository("dtypes"), "--frontend", "triton", "--allow-client-shm")


Client = grpcclient.InferenceServerClient | httpclient.InferenceServerClient


@pytest.fixture
def clients(door: BridgeServer) -> Iterator[dict[str, Client]]:
    made: dict[str, Client] = {
        "grpc": grpcclient.InferenceServerClient(door.grpc_url),
        "http": httpclient.InferenceServerClient(door.http_url),
    }
    yield made
    for client in made.values():
        client.unregister_system_shared_memory()
        client.close()


@pytest.fixture
def shm_path() -> Iterator[Callable[[], Path]]:
    """Makes fresh names under /dev/shm; whatever is there under them afterwards is removed."""
    paths: list[Path] = []

    def new() -> Path:
        paths.append(SHM / f"bridge_e2e_shm_{uuid.uuid4().hex}")
        return paths[-1]

    yield new
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            for child in path.iterdir():
                child.unlink()
            path.rmdir()
        else:
            path.unlink(missing_ok=True)


def refused(client: Client, key: str) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as caught:
        client.register_system_shared_memory("evil", key, 64)
    return str(caught.value.status()), caught.value.message()


def internal(wire: str) -> str:
    return "StatusCode.INTERNAL" if wire == "grpc" else "500"


def invalid_arg(wire: str) -> str:
    return "StatusCode.INVALID_ARGUMENT" if wire == "grpc" else "400"


def infer(
    client: Client, wire: str, region_in: str | None, region_out: str | None
) -> np.ndarray | None:
    """OUTPUT0 of identity_fp32 for FOUR (None when it went into `region_out`)."""
    module = grpcclient if wire == "grpc" else httpclient
    tensor = module.InferInput("INPUT0", [1, 4], "FP32")
    if region_in is None:
        tensor.set_data_from_numpy(FOUR)
    else:
        tensor.set_shared_memory(region_in, 16)
    output = module.InferRequestedOutput("OUTPUT0")
    if region_out is not None:
        output.set_shared_memory(region_out, 16)
    result = client.infer("identity_fp32", [tensor], outputs=[output])
    return result.as_numpy("OUTPUT0") if region_out is None else None


def assert_serving(door: BridgeServer, clients: dict[str, Client]) -> None:
    assert door.running
    for wire, client in clients.items():
        np.testing.assert_array_equal(infer(client, wire, None, None), FOUR)
    assert httpx.get(f"http://{door.http_url}/v2/health/live", timeout=30).status_code == 200


@pytest.mark.parametrize("wire", WIRES)
def test_a_traversal_key_maps_no_file_outside_dev_shm(door, clients, tmp_path, wire):
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    for key in (os.path.relpath(secret, SHM), "/" + os.path.relpath(secret, SHM)):
        assert refused(clients[wire], key) == (
            internal(wire),
            f"Unable to open shared memory region: '{key}'",
        )
    assert secret.read_bytes() == SECRET
    assert_serving(door, clients)


@pytest.mark.parametrize("wire", WIRES)
def test_a_symlink_in_dev_shm_is_not_followed(clients, tmp_path, shm_path, wire):
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    link = shm_path()
    link.symlink_to(secret)
    key = "/" + link.name
    assert refused(clients[wire], key) == (
        internal(wire),
        f"Unable to open shared memory region: '{key}'",
    )
    assert secret.read_bytes() == SECRET


@pytest.mark.parametrize("wire", WIRES)
def test_a_key_with_an_inner_slash_is_refused(clients, shm_path, wire):
    folder = shm_path()
    folder.mkdir()
    (folder / "object").write_bytes(bytes(64))
    key = f"/{folder.name}/object"
    assert refused(clients[wire], key) == (
        internal(wire),
        f"Unable to open shared memory region: '{key}'",
    )


@pytest.mark.parametrize("wire", WIRES)
def test_a_truncated_region_is_an_error_and_the_server_keeps_serving(door, clients, shm_path, wire):
    client = clients[wire]
    path_in, path_out = shm_path(), shm_path()
    path_in.write_bytes(FOUR.tobytes() + bytes(48))
    path_out.write_bytes(bytes(64))
    client.register_system_shared_memory("in", "/" + path_in.name, 64)
    client.register_system_shared_memory("out", "/" + path_out.name, 64)
    infer(client, wire, "in", "out")
    assert path_out.read_bytes()[:16] == FOUR.tobytes()

    for truncated, region in ((path_in, "in"), (path_out, "out")):
        os.truncate(truncated, 0)
        with pytest.raises(InferenceServerException) as caught:
            infer(client, wire, "in", "out")
        assert (str(caught.value.status()), caught.value.message()) == (
            invalid_arg(wire),
            f"Invalid offset + byte size for shared memory region: '{region}'",
        )
        assert_serving(door, clients)
        truncated.write_bytes(FOUR.tobytes() + bytes(48))  # the client gives the bytes back

    infer(client, wire, "in", "out")  # the same regions work again
    assert path_out.read_bytes()[:16] == FOUR.tobytes()


@pytest.mark.skipif(cuda_usable(), reason="CUDA works here: tests/gpu registers for real")
def test_cuda_shared_memory_is_refused_as_triton_without_gpus(clients) -> None:
    handle = base64.b64encode(bytes(64))  # a cudaIpcMemHandle_t, as both clients take it
    with pytest.raises(InferenceServerException) as grpc_error:
        clients["grpc"].register_cuda_shared_memory("c1", handle, 0, 64)
    assert grpc_error.value.status() == "StatusCode.UNIMPLEMENTED"
    assert grpc_error.value.message() == (
        "failed to register CUDA shared memory region: 'c1', GPUs not supported"
    )
    with pytest.raises(InferenceServerException) as http_error:
        clients["http"].register_cuda_shared_memory("c1", handle, 0, 64)
    assert http_error.value.message() == "failed to register shared memory region: invalid args"
    # Nothing was registered.
    assert not clients["grpc"].get_cuda_shared_memory_status().regions
    assert clients["http"].get_cuda_shared_memory_status() == []
