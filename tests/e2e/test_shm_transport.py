"""Tensors between a triton door (`--role frontend`) and a worker (`--role worker`) on one host
go through shared memory, not the request plane (bridge/transport/); a worker on another host
keeps the bytes form. A request's own regions live no longer than the request: they are gone
after a success, a model error, a client's cancellation, and a SIGKILL of either side. The door's
pooled regions are reused from request to request (a dead worker's hold on one ends with it),
and live no longer than the door.

The probe model says which form reached it: VIEW is 1 when its input is a view of a mapped
region (the shared memory form, no copy), 0 when the bytes came inline. Real processes, real
Dynamo runtime (file discovery, tcp), real tritonclient.

No client of the door can register the door's own regions through Triton's system shared
memory API (issue 38, finding 1): not by their names, nor by a second name of their objects.

Each mechanism is proven on its own: the door's periodic sweep is set to an hour
(DYN_BRIDGE_SHM_SWEEP_S) where a request's own clean-up must free its regions; the crash
tests set it to a second where a sweep must.
"""

from __future__ import annotations

import os
import queue
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from bridge.transport import shm_regions
from tests.harness.cluster import Cluster, start_all
from tests.harness.services import EtcdServer, NatsServer, require_service

MODEL = """
import mmap, os, time
import numpy as np
import triton_python_backend_utils as pb_utils

FLAGS = {flags!r}


def _mapped(array):
    base = array
    while base is not None:
        if isinstance(base, mmap.mmap):
            return True
        base = getattr(base, "base", None) if not isinstance(base, memoryview) else base.obj
    return False


def _wait_for(path, request=None):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not os.path.exists(path):
        if request is not None and request.is_cancelled():
            open(os.path.join(FLAGS, "cancelled"), "w").close()
            return False
        time.sleep(0.01)
    return True


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            mode = float(x[0])
            if mode in (-2.0, -3.0):
                open(os.path.join(FLAGS, "started"), "w").close()
                # -2: until the client is gone; -3: until the test opens the gate
                _wait_for(os.path.join(FLAGS, "gate"), request if mode == -2.0 else None)
            if mode == -1.0:
                raise ValueError("probe failure")
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", (x * 2).astype(np.float32)),
                pb_utils.Tensor("VIEW", np.array([int(_mapped(x))], np.int32)),
            ]))
        return responses
"""

CONFIG = """
name: "probe"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "VIEW" data_type: TYPE_INT32 dims: [ 1 ] }
]
"""

LARGE = 1_000_000  # FP32: 4 MB each way, far above the threshold


def _repository(root: Path, flags: Path) -> Path:
    folder = root / "repo" / "probe"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(CONFIG)
    (folder / "1" / "model.py").write_text(MODEL.format(flags=str(flags)))
    return root / "repo"


@pytest.fixture
def flags(tmp_path: Path) -> Path:
    folder = tmp_path / "flags"
    folder.mkdir()
    return folder


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster(tmp_path / "cluster")
    yield made
    made.stop()


def _input(values: np.ndarray) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT0", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values)
    return [tensor]


def _large(first: float = 1.0) -> np.ndarray:
    values = np.arange(LARGE, dtype=np.float32)
    values[0] = first
    return values


def _regions(door_pid: int, kinds: str = "io") -> list[str]:
    """The door's regions now in /dev/shm, of `kinds`: its requests' own (`i`, `o`), its pool's
    (`p`)."""
    return [
        n
        for n in shm_regions.names()
        if (p := shm_regions.parse(n)) and p[1] == door_pid and p[3] in kinds
    ]


def _wait(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _infer(client: grpcclient.InferenceServerClient, values: np.ndarray) -> tuple[np.ndarray, int]:
    result = client.infer("probe", _input(values))
    return result.as_numpy("OUTPUT0"), int(result.as_numpy("VIEW")[0])


def test_requests_through_shared_memory_free_their_regions(
    cluster: Cluster, tmp_path: Path, flags: Path
) -> None:
    repository = _repository(tmp_path, flags)
    worker = cluster.worker(repository)
    # No periodic sweep in the door: only each request's own clean-up may free its regions.
    frontend = cluster.frontend("--frontend", "triton", env={shm_regions.SWEEP_ENV: "3600"})
    start_all([worker, frontend])
    frontend.wait_model_ready("probe", timeout=60)
    client = frontend.client()
    door = frontend.pid

    # Success: 1M FP32 in a region (the model sees a view of it), the answer correct.
    values = _large()
    output, view = _infer(client, values)
    np.testing.assert_array_equal(output, values * 2)
    assert view == 1
    # 12 MB each way: the door copies into and out of the regions on a thread.
    values = np.arange(3 * LARGE, dtype=np.float32)
    output, view = _infer(client, values)
    np.testing.assert_array_equal(output, values * 2)
    assert view == 1
    # A small tensor stays inline.
    output, view = _infer(client, np.array([1, 2, 3, 4], np.float32))
    np.testing.assert_array_equal(output, [2, 4, 6, 8])
    assert view == 0
    _wait(lambda: not _regions(door), "the regions of finished requests to go", timeout=5)
    # The pool's regions are reused: more requests of the same sizes make none.
    pooled = set(_regions(door, "p"))
    assert pooled
    for first in (5.0, 6.0, 7.0):
        output, view = _infer(client, _large(first))
        np.testing.assert_array_equal(output, _large(first) * 2)
    assert set(_regions(door, "p")) == pooled

    # Many at once, of three sizes (the pool fills up, offers of the wrong size): every answer
    # is its own request's.
    answers: queue.Queue = queue.Queue()
    sent = {k: np.arange(LARGE // 4 * (1 + k % 3), dtype=np.float32) + k for k in range(12)}
    for k, values in sent.items():
        client.async_infer(
            "probe", _input(values), lambda result, error, k=k: answers.put((k, result, error))
        )
    for _ in sent:
        k, result, error = answers.get(timeout=60)
        assert error is None, error
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), sent[k] * 2)
    _wait(lambda: not _regions(door), "the regions of finished requests to go", timeout=5)

    # A model error.
    with pytest.raises(InferenceServerException, match="probe failure"):
        _infer(client, _large(-1.0))
    _wait(lambda: not _regions(door), "the regions of a failed request to go", timeout=5)

    # A client's cancellation while the model holds the request: the input's region exists
    # while it is in flight, and goes with the request.
    errors: queue.Queue = queue.Queue()
    call = client.async_infer(
        "probe", _input(_large(-2.0)), lambda result, error: errors.put(error)
    )
    _wait(lambda: (flags / "started").exists(), "the model to start")
    assert _regions(door, "iop")
    call.cancel()
    error = errors.get(timeout=30)
    assert error is not None and "ancel" in str(error), error
    _wait(lambda: (flags / "cancelled").exists(), "the model to see its cancellations")
    _wait(lambda: not _regions(door), "the regions of a cancelled request to go", timeout=5)
    output, view = _infer(client, _large())  # still served
    assert view == 1

    # The door stops: its pool goes with it.
    frontend.stop()
    assert not _regions(door, "iop")


def test_no_client_registers_the_door_s_own_regions(
    cluster: Cluster, tmp_path: Path, flags: Path
) -> None:
    repository = _repository(tmp_path, flags)
    worker = cluster.worker(repository)
    frontend = cluster.frontend("--frontend", "triton", "--allow-client-shm")
    start_all([worker, frontend])
    frontend.wait_model_ready("probe", timeout=60)
    door = frontend.pid

    # Another client's request is in flight: its input in one of the door's pooled regions,
    # another offered for its answer, while the model waits for the gate.
    answers: queue.Queue = queue.Queue()
    values = _large(-3.0)
    frontend.client().async_infer(
        "probe", _input(values), lambda result, error: answers.put((result, error))
    )
    _wait(lambda: (flags / "started").exists(), "the model to start")
    pooled = _regions(door, "p")
    assert pooled

    # From the same user as the door, on both wires: by name, and by a name of the caller's own
    # for the same object (a hard link only a local user of the server's uid can make).
    grpc = frontend.client()
    http = httpclient.InferenceServerClient(frontend.http_url)
    links = []
    try:
        for name in pooled:
            links.append(link := f"bridge_test_link_{os.getpid()}_{len(links)}")
            os.link(f"{shm_regions.SHM_DIRECTORY}/{name}", f"{shm_regions.SHM_DIRECTORY}/{link}")
            for key, why in (
                (name, "contains the reserved prefix 'dynbridge-'"),
                ("/" + name, "contains the reserved prefix 'dynbridge-'"),
                ("/" + link, "names a shared memory region of the server"),
            ):
                for client in (grpc, http):
                    with pytest.raises(InferenceServerException, match=why):
                        client.register_system_shared_memory("stolen", key, 128)
        assert not grpc.get_system_shared_memory_status().regions
        assert not http.get_system_shared_memory_status()
    finally:
        for link in links:
            os.unlink(f"{shm_regions.SHM_DIRECTORY}/{link}")
        (flags / "gate").touch()
    # The other client's answer is its own, untouched.
    result, error = answers.get(timeout=60)
    assert error is None, error
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values * 2)


def test_regions_of_a_crashed_side_are_swept(cluster: Cluster, tmp_path: Path, flags: Path) -> None:
    repository = _repository(tmp_path, flags)
    sweep = {shm_regions.SWEEP_ENV: "1"}
    # A region left by a door that died before these processes started: swept at their start.
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"{shm_regions.PREFIX}{shm_regions.pid_namespace()}-{dead.pid}-1-i"
    os.close(shm_regions.create(stale, 4096))
    worker = cluster.worker(repository, env=sweep)
    frontend = cluster.frontend("--frontend", "triton", env={shm_regions.SWEEP_ENV: "3600"})
    start_all([worker, frontend])
    frontend.wait_model_ready("probe", timeout=60)
    assert stale not in shm_regions.names()
    client = frontend.client()
    door = frontend.pid

    # The worker is SIGKILLed while it holds a request (and maps its pooled input region):
    # the door frees the request's own regions, and the kernel the worker's hold on the pool's.
    client.async_infer("probe", _input(_large(-3.0)), lambda *a: None)
    _wait(lambda: (flags / "started").exists(), "the model to start")
    pooled = set(_regions(door, "p"))
    assert pooled
    worker.kill()
    _wait(lambda: not _regions(door), "the door to free a dead worker's request", timeout=10)

    # A new worker, served from the same pooled regions; then the door is SIGKILLed while a
    # request is in flight: the worker's sweep frees the dead door's regions, pooled ones too
    # (the model's view of its input stays valid).
    (flags / "started").unlink()
    replacement = cluster.worker(repository, env=sweep, name="worker2").start()
    _wait(lambda: _probe_ok(client), "the door to reach the new worker", timeout=60)
    assert set(_regions(door, "p")) == pooled
    client.async_infer("probe", _input(_large(-3.0)), lambda *a: None)
    _wait(lambda: (flags / "started").exists(), "the model to start")
    assert _regions(door, "iop")
    frontend.kill()
    _wait(
        lambda: not _regions(door, "iop"), "the worker to sweep a dead door's regions", timeout=10
    )
    (flags / "gate").touch()  # the model finishes with a dead client: the worker goes on
    assert replacement.process is not None and replacement.process.poll() is None


def _probe_ok(client: grpcclient.InferenceServerClient) -> bool:
    try:
        return _infer(client, _large())[1] == 1
    except InferenceServerException:
        return False


def test_a_worker_on_another_host_gets_the_bytes(
    cluster: Cluster, tmp_path: Path, flags: Path
) -> None:
    repository = _repository(tmp_path, flags)
    worker = cluster.worker(repository, env={shm_regions.HOST_ID_ENV: "another-host"})
    frontend = cluster.frontend("--frontend", "triton")
    start_all([worker, frontend])
    frontend.wait_model_ready("probe", timeout=60)
    values = _large()
    output, view = _infer(frontend.client(), values)
    np.testing.assert_array_equal(output, values * 2)
    assert view == 0
    assert not _regions(frontend.pid, "iop")


def test_shared_memory_with_etcd_and_the_nats_request_plane(tmp_path: Path, flags: Path) -> None:
    # The form does not depend on the request plane: the handle travels over NATS alike.
    require_service("etcd")
    require_service("nats-server")
    repository = _repository(tmp_path, flags)
    with EtcdServer(tmp_path / "etcd") as etcd, NatsServer(tmp_path / "nats") as nats:
        cluster = Cluster(
            tmp_path / "cluster",
            discovery="etcd",
            request_plane="nats",
            etcd_endpoint=etcd.endpoint,
            nats_url=nats.url,
        )
        try:
            start_all(
                [cluster.worker(repository), frontend := cluster.frontend("--frontend", "triton")]
            )
            frontend.wait_model_ready("probe", timeout=60)
            values = _large()
            output, view = _infer(frontend.client(), values)
            np.testing.assert_array_equal(output, values * 2)
            assert view == 1
            _wait(lambda: not _regions(frontend.pid), "the request's regions to go", timeout=5)
            assert _regions(frontend.pid, "p")  # the pool's, for the next request
        finally:
            cluster.stop()
