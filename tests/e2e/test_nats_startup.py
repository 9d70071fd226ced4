"""Two ways Dynamo 1.6.1's runtime threads wedged a bridge process on the NATS request plane.

A frontend started after a worker that already serves many models comes up (issue 23).
Measured before the fix on this 2-CPU host, with etcd discovery and the NATS request plane: a
frontend started after a worker serving the examples repository (10 models) never answered and
ignored SIGTERM, Dynamo's door 4 of 4 times; gdb showed both runtime threads in
`ModelWatcher::prepare_worker_set → block_in_place → block_on`. Dynamo 1.6.1 sizes its blocking
pool to the number of CPUs (2 here); the bridge now raises it when the user has set neither
DYN_RUNTIME_MAX_BLOCKING_THREADS nor DYN_RUNTIME_NUM_WORKER_THREADS (bridge/tuning.py).

`DistributedRuntime.endpoint()` made while responses arrive (issue 39): it waits for the
runtime holding the GIL, and the runtime's worker threads wait for the GIL to complete Python
awaitables (bridge/dynamo_endpoints.py). nats_wedge_load.py is one process that does that
with 16 streams in flight: with Dynamo's 2 worker threads it wedges, and the bridge's watchdog
ends it with the stacks; with the threads the bridge sets on nats it makes every one.
"""

from __future__ import annotations

import os
import subprocess
import sys
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


def wedge_load(
    services: tuple[EtcdServer, NatsServer], namespace: str, *flags: str, **environ: str
) -> subprocess.CompletedProcess[str]:
    etcd, nats = services
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYN_RUNTIME_")}
    env.update(
        ETCD_ENDPOINTS=etcd.endpoint,
        NATS_SERVER=nats.url,
        DYN_TCP_RESPONSE_STREAM_HOST="127.0.0.1",
        DYN_TCP_RPC_HOST="127.0.0.1",
        DYN_LOG="error",
        PYTHONPATH=str(PROJECT_ROOT),
        **environ,
    )
    script = Path(__file__).with_name("nats_wedge_load.py")
    return subprocess.run(
        [sys.executable, str(script), "--namespace", namespace, *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_an_endpoint_made_while_responses_arrive_wedges_with_dynamos_threads(
    services: tuple[EtcdServer, NatsServer],
) -> None:
    # Dynamo's own count on this 2-CPU host: the first or second call wedges (measured 6 of 6).
    # Should a later Dynamo release the GIL there, this fails: the watchdog can then go.
    done = wedge_load(
        services, "wedge_dynamo", "--wedged-s", "3", DYN_RUNTIME_NUM_WORKER_THREADS="2"
    )
    assert done.returncode == 1, done.stdout[-500:] + done.stderr[-3000:]
    assert "done" not in done.stdout
    # faulthandler's dump: the thread stopped in the call, named by the watchdog's own frame
    assert "Timeout (0:00:03)!" in done.stderr, done.stderr[-3000:]
    assert 'bridge/dynamo_endpoints.py", line' in done.stderr
    assert "in dynamo_endpoint" in done.stderr


def test_with_the_threads_the_bridge_sets_on_nats_every_endpoint_is_made(
    services: tuple[EtcdServer, NatsServer],
) -> None:
    done = wedge_load(services, "wedge_bridge", "--bridge-threads", "--calls", "300")
    assert done.returncode == 0, done.stdout[-500:] + done.stderr[-3000:]
    assert done.stdout.splitlines()[-2:] == ["made 300", "done"]
