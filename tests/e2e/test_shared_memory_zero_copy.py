"""A client's system shared memory reaches `execute` with no copy in the embedded door (issue 27
item 4), over real gRPC and HTTP with tritonclient, and only where that is safe (shm.py).

The model holds its request on a gate file while the test acts, so what is observed is ordered
by events, not by time:

- An input region owned by our own uid is mapped while the request runs (/proc/<pid>/maps
  names the object), and `execute`'s input is a view of it: what the client writes into its
  region while `execute` holds the request is what the model reads afterwards (a copy would
  still hold the old values). The model's own writes to its input stay private (Triton's
  inputs are writable and its stub hands the model a copy). The requested output is in the
  output region (written from the model's array, never mapped), and nothing is mapped once
  the request is over.
- A region unregistered while a request uses it keeps serving that request: its input and
  output regions stay valid until it ends (Triton ≥ 2.53 defers the unregistering the same way).
- A region owned by another uid is never mapped: its input is copied (a write by the client
  after `execute` began is not seen), and truncating its output region while a request uses it
  is Triton's INVALID_ARG, and the server keeps serving.
"""

from __future__ import annotations

import os
import queue
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.support import Gate, wait_until
from tests.harness import BridgeServer

SHM = Path("/dev/shm")
WIRES = ("grpc", "http")
COUNT = 1 << 20  # 1M FP32: the size issue 27 names
SIZE = 4 * COUNT
VALUES = np.arange(COUNT, dtype=np.float32)
CHANGED = VALUES + 0.5
NOBODY = 65534

pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm on this host")

CONFIG = """
name: "held_view"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [
  { name: "BEFORE" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "AFTER" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "WRITABLE" data_type: TYPE_BOOL dims: [ 1 ] }
]
"""

MODEL = '''
"""Reads its input, writes `started`, waits for `gate` (request parameters), reads it again,
then writes into it: BEFORE and AFTER are what it read, WRITABLE whether it could write."""
import json
import os
import queue
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            before = x.copy()
            p = json.loads(request.parameters() or "{}")
            if p.get("started"):
                open(p["started"], "w").close()
                deadline = time.monotonic() + 60
                while not os.path.exists(p["gate"]) and time.monotonic() < deadline:
                    time.sleep(0.01)
            after = x.copy()
            writable = bool(x.flags.writeable)
            if writable:
                x[...] = -1  # never seen by the client
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("BEFORE", before),
                pb_utils.Tensor("AFTER", after),
                pb_utils.Tensor("WRITABLE", np.array([writable])),
            ]))
        return responses
'''


@pytest.fixture(scope="module")
def door(shared_bridge_server, tmp_path_factory) -> BridgeServer:
    repository = tmp_path_factory.mktemp("zero_copy_repository")
    (repository / "held_view" / "1").mkdir(parents=True)
    (repository / "held_view" / "config.pbtxt").write_text(CONFIG)
    (repository / "held_view" / "1" / "model.py").write_text(MODEL)
    return shared_bridge_server(repository, "--frontend", "triton", "--allow-client-shm")


Client = grpcclient.InferenceServerClient | httpclient.InferenceServerClient


def client_for(door: BridgeServer, wire: str) -> Client:
    if wire == "grpc":
        return grpcclient.InferenceServerClient(door.grpc_url)
    return httpclient.InferenceServerClient(door.http_url)


@pytest.fixture
def regions(door: BridgeServer) -> Iterator[Callable[[str, str], Path]]:
    """Makes an object under /dev/shm holding VALUES (+ zeros) and registers it on both wires'
    door; everything is unregistered and removed afterwards."""
    paths: list[Path] = []
    grpc_client = grpcclient.InferenceServerClient(door.grpc_url)

    def make(name: str, wire: str) -> Path:
        path = SHM / f"bridge_zero_copy_{uuid.uuid4().hex}"
        path.write_bytes(VALUES.tobytes())
        paths.append(path)
        with client_for(door, wire) as client:
            client.register_system_shared_memory(name, "/" + path.name, SIZE)
        return path

    yield make
    grpc_client.unregister_system_shared_memory()
    grpc_client.close()
    for path in paths:
        path.unlink(missing_ok=True)


def mapped(door: BridgeServer, path: Path) -> bool:
    """Does the door's process map the object now?"""
    assert door.process is not None
    maps = Path(f"/proc/{door.process.pid}/maps").read_text()
    return any(line.endswith(" " + str(path)) for line in maps.splitlines())


def infer_held(door: BridgeServer, wire: str, gate: Gate) -> dict[str, Any]:
    """held_view on INPUT0 from region "in", AFTER into region "out"; held until the gate
    opens. The outputs sent back (BEFORE, WRITABLE)."""
    module: Any = grpcclient if wire == "grpc" else httpclient
    with client_for(door, wire) as client:
        tensor = module.InferInput("INPUT0", [COUNT], "FP32")
        tensor.set_shared_memory("in", SIZE)
        after = module.InferRequestedOutput("AFTER")
        after.set_shared_memory("out", SIZE)
        outputs = [after, *(module.InferRequestedOutput(n) for n in ("BEFORE", "WRITABLE"))]
        result = client.infer("held_view", [tensor], outputs=outputs, parameters=gate.params(wire))
        return {name: result.as_numpy(name) for name in ("BEFORE", "WRITABLE")}


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    """Where a held request waits for its answer."""
    with ThreadPoolExecutor(1) as executor:
        yield executor


@pytest.fixture
def gates(tmp_path: Path, pool: ThreadPoolExecutor) -> Iterator[Callable[[str], Gate]]:
    """Makes gates; every one is opened at the end (before `pool` waits for its requests), so
    a failed test holds no request."""
    made: list[Gate] = []

    def new(name: str) -> Gate:
        (tmp_path / name).mkdir()
        made.append(Gate(tmp_path / name))
        return made[-1]

    yield new
    for gate in made:
        gate.open()


def held(door: BridgeServer, wire: str, gate: Gate, pool: ThreadPoolExecutor) -> Future:
    future = pool.submit(infer_held, door, wire, gate)
    wait_until(lambda: gate.started(wire) or future.done(), "execute to hold the request")
    if future.done():
        future.result()  # raises what went wrong
    return future


def listed(client: Client) -> int:
    """How many regions the door lists."""
    status = client.get_system_shared_memory_status()
    return (
        len(status.regions) if isinstance(client, grpcclient.InferenceServerClient) else len(status)
    )


def region_values(path: Path) -> np.ndarray:
    return np.frombuffer(path.read_bytes(), np.float32)


@pytest.mark.parametrize("wire", WIRES)
def test_an_input_in_the_clients_region_reaches_execute_as_a_view(door, regions, gates, pool, wire):
    path_in, path_out = regions("in", wire), regions("out", wire)
    gate = gates("first")
    future = held(door, wire, gate, pool)
    assert mapped(door, path_in)
    assert not mapped(door, path_out)  # an output is written, from the model's array
    with open(path_in, "r+b") as region:  # the client writes while execute holds it
        region.write(CHANGED.tobytes())
    gate.open()
    outputs = future.result(timeout=60)
    np.testing.assert_array_equal(outputs["BEFORE"], VALUES)
    np.testing.assert_array_equal(region_values(path_out), CHANGED)  # AFTER: read through the view
    assert outputs["WRITABLE"].tolist() == [True]
    np.testing.assert_array_equal(region_values(path_in), CHANGED)  # the model's -1s stayed its own
    wait_until(
        lambda: not mapped(door, path_in) and not mapped(door, path_out),
        "the mappings to go with their request",
    )


@pytest.mark.parametrize("wire", WIRES)
def test_a_region_unregistered_while_a_request_uses_it_serves_that_request(
    door, regions, gates, pool, wire
):
    path_in, path_out = regions("in", wire), regions("out", wire)
    gate = gates("first")
    with client_for(door, wire) as client:
        future = held(door, wire, gate, pool)
        client.unregister_system_shared_memory("in")
        client.unregister_system_shared_memory()  # every region, "out" too
        assert listed(client) == 2  # until the request ends, as Triton ≥ 2.53
        gate.open()
        outputs = future.result(timeout=60)
        np.testing.assert_array_equal(outputs["BEFORE"], VALUES)
        np.testing.assert_array_equal(region_values(path_out), VALUES)
        wait_until(lambda: not listed(client), "the regions to go")
    assert not mapped(door, path_in) and not mapped(door, path_out)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving an object to another uid needs root")
@pytest.mark.parametrize("wire", WIRES)
def test_a_region_of_another_uid_is_copied_and_its_truncation_is_an_error(
    door, regions, gates, pool, wire
):
    path_in, path_out = regions("in", wire), regions("out", wire)
    for path in (path_in, path_out):  # owned by another uid from before the door opens them
        os.chown(path, NOBODY, NOBODY)
    with client_for(door, wire) as client:
        client.unregister_system_shared_memory()
        client.register_system_shared_memory("in", "/" + path_in.name, SIZE)
        client.register_system_shared_memory("out", "/" + path_out.name, SIZE)
    gate = gates("first")
    future = held(door, wire, gate, pool)
    assert not mapped(door, path_in) and not mapped(door, path_out)
    with open(path_in, "r+b") as region:
        region.write(CHANGED.tobytes())  # too late: the input was copied
    gate.open()
    outputs = future.result(timeout=60)
    np.testing.assert_array_equal(region_values(path_out), VALUES)  # AFTER: the copy's

    gate = gates("second")
    future = held(door, wire, gate, pool)
    os.truncate(path_out, 0)  # under the request: its output cannot go there
    gate.open()
    with pytest.raises(InferenceServerException) as caught:
        future.result(timeout=60)
    status = "StatusCode.INVALID_ARGUMENT" if wire == "grpc" else "400"
    assert (str(caught.value.status()), caught.value.message()) == (
        status,
        "Invalid offset + byte size for shared memory region: 'out'",
    )

    path_out.write_bytes(bytes(SIZE))  # the client gives the bytes back: served again
    gate = gates("third")
    future = held(door, wire, gate, pool)
    gate.open()
    outputs = future.result(timeout=60)
    np.testing.assert_array_equal(outputs["BEFORE"], CHANGED)
    np.testing.assert_array_equal(region_values(path_out), CHANGED)
    np.testing.assert_array_equal(region_values(path_in), CHANGED)
    assert door.running


def test_a_streamed_request_uses_the_regions_too(door, regions):
    path_in, path_out = regions("in", "grpc"), regions("out", "grpc")
    answers: queue.Queue = queue.Queue()
    with client_for(door, "grpc") as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            tensor = grpcclient.InferInput("INPUT0", [COUNT], "FP32")
            tensor.set_shared_memory("in", SIZE)
            after = grpcclient.InferRequestedOutput("AFTER")
            after.set_shared_memory("out", SIZE)
            outputs = [after, grpcclient.InferRequestedOutput("BEFORE")]
            client.async_stream_infer("held_view", [tensor], outputs=outputs)
            result, error = answers.get(timeout=60)
        finally:
            client.stop_stream()
    assert error is None
    np.testing.assert_array_equal(result.as_numpy("BEFORE"), VALUES)
    np.testing.assert_array_equal(region_values(path_out), VALUES)
    np.testing.assert_array_equal(region_values(path_in), VALUES)
