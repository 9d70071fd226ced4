"""dynamo-bridge split into `--role worker` and `--role frontend` processes (issue 12).

Real Dynamo discovery (file, etcd) and request planes (tcp, nats), real etcd and nats-server
(installed when missing, tests/harness/services.py; never skipped in CI), real tritonclient.
Models: tests/repositories/scale_out (`whoami` answers with its process id) and the hot-reload
repository (tests/repositories/reload).

Discovery facts these tests lean on (ai-dynamo-runtime 1.6.1, measured for issue 12): a worker
that stops with rt.shutdown() leaves discovery at once; one killed with SIGKILL stays listed
until its entry expires (about 10 s with `file`; with etcd when its lease ends, ETCD_LEASE_TTL,
about 30 s by default), and meanwhile the frontend sends it one request each time its 5 s
inhibition of the failed instance ends.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.metrics_support import scrape, value
from tests.e2e.reload_support import Traffic, copy_models, set_line
from tests.e2e.support import REPOSITORIES, fp32_input, wait_until
from tests.harness import BridgeServer
from tests.harness.cluster import (
    Cluster,
    LoadGenerator,
    Outcome,
    describe,
    start_all,
)
from tests.harness.roles import Frontend, Worker
from tests.harness.services import (
    EtcdServer,
    NatsServer,
    etcd_keys,
    nats_connections,
    require_service,
)

SCALE_OUT = REPOSITORIES / "scale_out"
# How long Dynamo 1.6.1 keeps a killed worker's `file` discovery entry (measured ~10 s), and
# how long it then keeps routing one request to it now and then: generous bounds, not timings.
FILE_TTL_S = 10.0
ETCD_LEASE_TTL_S = 3.0  # set on the processes with ETCD_LEASE_TTL
INHIBIT_S = 5.0


def pid_of(result: grpcclient.InferResult) -> int:
    return int(result.as_numpy("PID")[0])


def one_value() -> list[grpcclient.InferInput]:
    return [fp32_input([1.0])]


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EtcdServer, NatsServer]]:
    """One etcd and one nats-server for the module; each test has its own namespace in them."""
    require_service("etcd")
    require_service("nats-server")
    root = tmp_path_factory.mktemp("services")
    with EtcdServer(root / "etcd") as etcd, NatsServer(root / "nats") as nats:
        yield etcd, nats


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BridgeServer]:
    """The embedded default (`--role all`, mem discovery) on the same repository: the reference
    answers."""
    log = tmp_path_factory.mktemp("embedded") / "bridge.log"
    with BridgeServer(SCALE_OUT, log_path=log) as server:
        server.wait_model_ready("whoami")
        yield server


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """make(**Cluster fields) -> a Cluster in tmp_path; all its processes are stopped after the
    test (SIGTERM, then SIGKILL of each process group)."""
    made: list[Cluster] = []

    def make(**fields: Any) -> Cluster:
        made.append(Cluster(tmp_path / f"cluster{len(made)}", **fields))
        return made[-1]

    yield make
    for shape in made:
        shape.stop()


def ask(client: grpcclient.InferenceServerClient) -> grpcclient.InferResult:
    """The reference request: several values, parameters and a request id."""
    return client.infer(
        "whoami",
        [fp32_input([0.5, -2.0, 3.25])],
        parameters={"p_str": "s", "p_int": 3, "p_bool": True},
        request_id="scale-out-1",
    )


def answer(result: grpcclient.InferResult) -> dict[str, object]:
    """Everything of an answer except which process gave it."""
    response = result.get_response(as_json=True)
    outputs = {
        o["name"]: (o["datatype"], o["shape"]) for o in response["outputs"] if o["name"] != "PID"
    }
    values = {name: result.as_numpy(name).tolist() for name in outputs}
    # A parameter map's order is not kept by gRPC (protobuf maps) nor by Dynamo (hash maps).
    values["PARAMS"] = [json.loads(text) for text in values["PARAMS"]]
    return {"id": response.get("id"), "outputs": outputs, "values": values}


# -- split roles on each discovery backend and request plane -------------------------------


@pytest.mark.parametrize(
    "discovery, plane",
    [("file", "tcp"), ("etcd", "tcp"), ("etcd", "nats")],
    ids=["file-tcp", "etcd-tcp", "etcd-nats"],
)
def test_split_roles_answer_as_the_embedded_default(
    discovery: str,
    plane: str,
    services: tuple[EtcdServer, NatsServer],
    embedded: BridgeServer,
    cluster: Callable[..., Cluster],
) -> None:
    etcd, nats = services
    shape = cluster(
        discovery=discovery,
        request_plane=plane,
        etcd_endpoint=etcd.endpoint if discovery == "etcd" else None,
        nats_url=nats.url if plane == "nats" else None,
    )
    nats_before = nats_connections(nats)
    door, work = shape.frontend(), shape.worker(SCALE_OUT)
    start_all([door, work])  # the frontend finds a worker that started with it
    door.wait_model_ready("whoami")

    got = ask(door.client())
    assert pid_of(got) == work.pid, "the frontend answered itself instead of the worker"
    assert answer(got) == answer(ask(embedded.client()))
    config = door.client().get_model_config("whoami", as_json=True)
    assert config == embedded.client().get_model_config("whoami", as_json=True)

    # The processes really used the backend and plane they were given.
    if discovery == "file":
        entries = [p.name for p in shape.file_kv.rglob("*") if p.is_file()]
        assert any(shape.namespace in name for name in entries), entries
    else:
        keys = etcd_keys(etcd.endpoint)
        assert any(shape.namespace in key for key in keys), keys
    if plane == "nats":
        assert nats_connections(nats) >= nats_before + 2


# -- replicas --------------------------------------------------------------------------------


def two_replicas(make: Callable[..., Cluster], **fields: Any) -> tuple[Frontend, Worker, Worker]:
    shape = make(**fields)
    door = shape.frontend()
    a, b = shape.worker(SCALE_OUT, name="worker_a"), shape.worker(SCALE_OUT, name="worker_b")
    start_all([door, a, b])
    door.wait_model_ready("whoami")
    return door, a, b


def successes(worker: Worker) -> float:
    """nv_inference_request_success of `whoami` on the worker's metrics port."""
    samples = scrape(worker.metrics_port)
    return value(samples, "nv_inference_request_success", model="whoami", version="1") or 0.0


def seen_both(a: Worker, b: Worker) -> Callable[[list[Outcome]], bool]:
    def check(outcomes: list[Outcome]) -> bool:
        pids = {o.value for o in outcomes if o.ok}
        return {a.pid, b.pid} <= pids

    return check


def test_two_replicas_share_the_load(cluster: Callable[..., Cluster]) -> None:
    door, a, b = two_replicas(cluster)
    # Discovery of the second replica may lag the first: wait until both answered once.
    with LoadGenerator(door.grpc_url, "whoami", one_value, threads=4, keep=pid_of) as warm:
        warm.wait_for(seen_both(a, b), "answers from both workers")
    assert not warm.failures(), describe(warm.snapshot())

    before = {w.pid: successes(w) for w in (a, b)}
    load = LoadGenerator(
        door.grpc_url, "whoami", one_value, threads=4, max_requests=200, keep=pid_of
    )
    load.start()
    load.wait_for(lambda o: len(o) >= 200, "200 answers")
    outcomes = load.stop()
    assert not load.failures(), describe(outcomes)
    counts = Counter(o.value for o in outcomes)
    print(f"\nrequests per replica: a={counts[a.pid]} b={counts[b.pid]} of {len(outcomes)}")
    assert set(counts) == {a.pid, b.pid}
    assert min(counts.values()) >= len(outcomes) // 4, counts
    # Each worker's own Triton metrics count what it answered.
    assert {w.pid: successes(w) - before[w.pid] for w in (a, b)} == dict(counts)


@pytest.mark.parametrize("discovery", ["file", "etcd"])
def test_replica_killed_under_load_fails_only_its_requests(
    discovery: str,
    services: tuple[EtcdServer, NatsServer],
    cluster: Callable[..., Cluster],
) -> None:
    if discovery == "etcd":
        # Dynamo's etcd lease is ~30 s unless ETCD_LEASE_TTL says otherwise.
        ttl = ETCD_LEASE_TTL_S
        fields = {
            "discovery": "etcd",
            "etcd_endpoint": services[0].endpoint,
            "extra_env": {"ETCD_LEASE_TTL": str(int(ETCD_LEASE_TTL_S))},
        }
    else:
        ttl, fields = FILE_TTL_S, {}
    door, a, b = two_replicas(cluster, **fields)
    threads = 4
    load = LoadGenerator(
        door.grpc_url, "whoami", one_value, threads=threads, max_seconds=90, keep=pid_of,
        parameters={"delay_ms": 20},  # requests are in flight on b when it dies
    )  # fmt: skip
    with load:
        load.wait_for(seen_both(a, b), "answers from both workers")
        assert not load.failures(), describe(load.snapshot())
        killed_at = time.monotonic()
        b.kill()

        def settled(outcomes: list[Outcome]) -> bool:
            # Past the discovery TTL, and no failure for longer than the frontend's inhibition
            # of a failed instance: the dead replica is gone from the rotation.
            now = time.monotonic()
            last_failure = max((o.answered for o in outcomes if not o.ok), default=killed_at)
            return now - killed_at > ttl and now - last_failure > INHIBIT_S + 2

        load.wait_for(settled, "failures to stop after discovery expired the killed replica")
        # Survivors keep answering: a fresh batch all from a.
        settled_count = len(load.snapshot())
        load.wait_for(lambda o: len(o) >= settled_count + 50, "50 more answers")
    outcomes = load.snapshot()
    failures = [o for o in outcomes if not o.ok]
    after_kill = [o for o in outcomes if o.answered >= killed_at]
    last_failure = max((o.answered for o in failures), default=killed_at) - killed_at
    in_flight = sum(1 for o in failures if o.sent < killed_at)
    print(
        f"\nSIGKILL of one of two replicas ({discovery} discovery): {len(failures)} failed of "
        f"{len(after_kill)} requests answered after the kill ({in_flight} in flight at the kill, "
        f"{len(failures) - in_flight} routed to the dead replica later); last failure "
        f"{last_failure:.1f} s after the kill; {describe(outcomes)}"
    )
    assert all(o.answered >= killed_at for o in failures), "a failure before the kill"
    # In flight on b at the kill (at most one per client thread), then one per client thread
    # each time b's inhibition ends before discovery drops it.
    bound = threads * (1 + int((ttl + INHIBIT_S) / INHIBIT_S) + 1)
    assert len(failures) <= bound, describe(outcomes)
    tail = outcomes[settled_count:]
    assert tail and all(o.ok and o.value == a.pid for o in tail), describe(tail)


def test_replicas_stopped_under_load_fail_nothing(cluster: Callable[..., Cluster]) -> None:
    """Three replicas; two get SIGTERM in turn under load from 16 clients, so requests reach each
    through every step of its stop (model card withdrawn, instance record withdrawn, drain)."""
    shape = cluster()
    door = shape.frontend()
    workers = [shape.worker(SCALE_OUT, name=f"worker_{n}") for n in "abc"]
    start_all([door, *workers])
    door.wait_model_ready("whoami")
    load = LoadGenerator(
        door.grpc_url, "whoami", one_value, threads=16, max_seconds=90, keep=pid_of
    )
    codes = []
    with load:
        load.wait_for(lambda o: {w.pid for w in workers} <= {x.value for x in o if x.ok},
                      "answers from every worker")  # fmt: skip
        for stopping in workers[1:]:
            stopping.terminate()
            codes.append(stopping.wait_exit(timeout=60))
            stopped_at = time.monotonic()
            load.wait_for(
                lambda o, t=stopped_at: sum(1 for x in o if x.sent > t and x.ok) >= 100,
                "100 answers after the replica exited",
            )
    outcomes = load.snapshot()
    print(f"\nSIGTERM of two of three replicas in turn: {describe(outcomes)} of {len(outcomes)}")
    assert not load.failures(), describe(outcomes)
    assert codes == [0, 0], [w.log_tail() for w in workers[1:]]
    assert {o.value for o in outcomes if o.sent > stopped_at} == {workers[0].pid}


def test_restarted_worker_serves_again(cluster: Callable[..., Cluster]) -> None:
    shape = cluster()
    door, first = shape.frontend(), shape.worker(SCALE_OUT, name="first")
    start_all([door, first])
    door.wait_model_ready("whoami")
    client = door.client()
    assert pid_of(client.infer("whoami", one_value())) == first.pid

    first.terminate()
    assert first.wait_exit(timeout=60) == 0, first.log_tail()
    wait_until(lambda: not client.is_model_ready("whoami"), "the stopped worker's model to go")

    second = shape.worker(SCALE_OUT, name="second")
    second.start()
    healthy = second.ready_at - second.started_at

    def served() -> bool:
        try:
            return pid_of(client.infer("whoami", one_value())) == second.pid
        except Exception:  # not discovered yet
            return False

    wait_until(served, "the restarted worker to answer through the frontend", timeout=60)
    to_serve = time.monotonic() - second.started_at
    print(f"\nrestarted worker: /health 200 after {healthy:.2f} s, serving after {to_serve:.2f} s")
    assert door.running, "the frontend did not survive the restart"


def mark_of(result: grpcclient.InferResult) -> int:
    return int(result.as_numpy("MARK")[0])


def test_hot_reload_in_a_worker_under_load(tmp_path: Path, cluster: Callable[..., Cluster]) -> None:
    """Three edits of `marked` in a worker while 8 clients (and one that also asks ModelReady)
    go through a frontend in another process: each new MARK appears, nothing fails."""
    repo = copy_models(tmp_path, "marked")
    shape = cluster()
    door, work = shape.frontend(), shape.worker(repo)
    start_all([door, work])
    door.wait_model_ready("marked")
    load = LoadGenerator(door.grpc_url, "marked", one_value, threads=8, keep=mark_of)
    traffic = Traffic(door.grpc_url)  # sequential, with ModelReady checks
    load.start()
    traffic.start()
    try:
        for mark in (2, 3, 4):
            set_line(repo / "marked" / "1" / "model.py", "MARK = ", f"MARK = {mark}")
            load.wait_for(lambda o, mark=mark: o and o[-1].value == mark, f"MARK {mark} to answer")
        # Old and new may overlap briefly; then only the new one answers.
        load.wait_for(
            lambda o: len(o) >= 50 and {x.value for x in o[-50:]} == {4},
            "50 answers in a row from the last edit",
        )
    finally:
        outcomes = load.stop()
        traffic.stop()
    marks = [o.value for o in outcomes if o.ok]
    print(
        f"\nhot reload through a frontend, 3 edits: {len(outcomes) + len(traffic.marks)} "
        f"requests, {describe(outcomes)}, sequential client errors {len(traffic.errors)}, "
        f"ModelReady false {traffic.not_ready} times"
    )
    assert not load.failures(), describe(outcomes)
    assert traffic.errors == [], traffic.errors[:5]
    assert traffic.not_ready == 0
    assert set(marks) == {1, 2, 3, 4}
