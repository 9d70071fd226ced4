"""A frontend started after a worker that already serves many models comes up (issue 23).

Measured before the fix on this 2-CPU host, with etcd discovery and the NATS request plane: a
frontend started after a worker serving the examples repository (10 models) never answered and
ignored SIGTERM, Dynamo's door 4 of 4 times; gdb showed both runtime threads in
`ModelWatcher::prepare_worker_set → block_in_place → block_on`. Dynamo 1.6.1 sizes its blocking
pool to the number of CPUs (2 here); the bridge now raises it when the user has set neither
DYN_RUNTIME_MAX_BLOCKING_THREADS nor DYN_RUNTIME_NUM_WORKER_THREADS (bridge/tuning.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.support import wait_until
from tests.harness.bridge_server import PROJECT_ROOT
from tests.harness.cluster import Cluster
from tests.harness.services import EtcdServer, NatsServer, require_service

EXAMPLES = PROJECT_ROOT / "examples" / "model_repository"
MODELS = sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir())
# Bounds on "comes up at all", not timings: a deadlocked frontend never does.
FRONTEND_START_S = 60.0
MODELS_READY_S = 60.0


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EtcdServer, NatsServer]]:
    require_service("etcd")
    require_service("nats-server")
    root = tmp_path_factory.mktemp("services")
    with EtcdServer(root / "etcd") as etcd, NatsServer(root / "nats") as nats:
        yield etcd, nats


@pytest.fixture(scope="module")
def cluster(
    services: tuple[EtcdServer, NatsServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """etcd + NATS, and a worker serving the examples repository, already up."""
    etcd, nats = services
    shape = Cluster(
        Path(tmp_path_factory.mktemp("nats_startup")),
        discovery="etcd",
        request_plane="nats",
        etcd_endpoint=etcd.endpoint,
        nats_url=nats.url,
    )
    try:
        shape.worker(EXAMPLES, "--model-control-mode=none").start()
        yield shape
    finally:
        shape.stop()


def add_sub_inputs() -> list[grpcclient.InferInput]:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = grpcclient.InferInput(name, [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        inputs.append(tensor)
    return inputs


@pytest.mark.parametrize("door", ["dynamo", "triton"])
def test_a_frontend_started_after_a_worker_with_many_models_comes_up(
    cluster: Cluster, door: str
) -> None:
    assert len(MODELS) >= 10
    frontend = cluster.frontend(
        "--frontend", door, name=f"frontend_{door}", startup_timeout=FRONTEND_START_S
    )
    try:
        frontend.start()
        client = frontend.client()

        def all_ready() -> bool:
            return all(client.is_model_ready(name) for name in MODELS)

        wait_until(all_ready, "every model ready through the frontend", MODELS_READY_S)
        result = client.infer("add_sub", add_sub_inputs())
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 4), 2, np.float32))
        frontend.stop()
        assert frontend.returncode == 0, frontend.log_text[-3000:]
    finally:
        frontend.stop(timeout=5)
