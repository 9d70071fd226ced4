"""etcd going away under load (issue 22 finding 3): health tells the truth, a lost lease restarts
the process by itself once etcd answers (or, with --exit-on-lease-loss, stops it for a
supervisor to restart), and a frontend that lives on finds restarted workers.

Before the fix, with etcd stopped longer than the lease, Dynamo shut every process's runtime down
(roles/discovery.py says how) while each process lived on answering `/v2/health/ready` 200 and
served nothing, even once etcd was back; a worker restarted alone was not enough either.

Real etcd (stopped and restarted on the same address and data), real NATS for the nats request
plane, real bridge processes (tests/harness/cluster.py), real tritonclient. ETCD_LEASE_TTL
shortens Dynamo's lease so that a long outage stays short. Everything is bounded in time.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.support import REPOSITORIES, fp32_input, wait_until
from tests.harness.cluster import (
    Cluster,
    LoadGenerator,
    Outcome,
    describe,
    start_all,
)
from tests.harness.ports import LOCALHOST, free_port
from tests.harness.roles import Frontend, Worker
from tests.harness.services import EtcdServer, NatsServer, etcd_keys, require_service

SCALE_OUT = REPOSITORIES / "scale_out"
# Long enough that a short outage (stop, seen not ready, restart) ends well inside it: Dynamo
# renews at half the TTL, so an outage may start with only half of it left.
LEASE_TTL_S = 20
# How long Dynamo's frontend may take to hear that an instance left etcd (its watch's event).
WATCH_LAG_S = 1.0
LOST_TEXT = "shut this process's runtime down"
UNREACHABLE_TEXT = "cannot reach etcd at"


def pid_of(result: grpcclient.InferResult) -> int:
    return int(result.as_numpy("PID")[0])


def one_value() -> list[grpcclient.InferInput]:
    return [fp32_input([1.0])]


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """An etcd of the test's own: the test stops and restarts it."""
    require_service("etcd")
    with EtcdServer(tmp_path / "etcd") as server:
        yield server


@pytest.fixture
def nats(tmp_path: Path) -> Iterator[NatsServer]:
    require_service("nats-server")
    with NatsServer(tmp_path / "nats") as server:
        yield server


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def _server_ready(url: str) -> bool | None:
    client = grpcclient.InferenceServerClient(url)
    try:
        return client.is_server_ready(client_timeout=2)
    except Exception:  # not answering
        return None
    finally:
        client.close()


class Readiness:
    """Every health surface of the cluster's processes, polled on a thread until stop():
    surface name -> the (time, ready) samples; ready is None when nothing answers."""

    def __init__(
        self, door: Frontend, control_port: int, workers: list[Worker], triton: bool
    ) -> None:
        self.samples: dict[str, list[tuple[float, bool | None]]] = {}
        self._probes: dict[str, Callable[[], bool | None]] = {
            "frontend /v2/health/ready": self._http(door.metrics_port, "/v2/health/ready"),
            "frontend control port": self._http(control_port, "/v2/health/ready"),
        }
        if triton:  # Dynamo's KServe frontend answers ServerReady itself
            self._probes["frontend ServerReady"] = lambda: _server_ready(door.grpc_url)
        else:  # Dynamo's frontend's /health, through the metrics port
            self._probes["frontend /health"] = self._http(door.metrics_port, "/health")
        for worker in workers:
            port, system = worker.metrics_port, worker.system_port
            self._probes[f"{worker.name} /v2/health/ready"] = self._http(port, "/v2/health/ready")
            self._probes[f"{worker.name} system /health"] = self._http(system, "/health")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _http(port: int, path: str) -> Callable[[], bool | None]:
        def probe() -> bool | None:
            status = _status(f"http://{LOCALHOST}:{port}{path}")
            return None if status is None else status == 200

        return probe

    def __enter__(self) -> Readiness:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, probe in self._probes.items():
                self.samples.setdefault(name, []).append((time.monotonic(), probe()))
            time.sleep(0.2)

    def latest(self) -> dict[str, bool | None]:
        return {name: samples[-1][1] for name, samples in self.samples.items() if samples}

    def all_are(self, ready: bool) -> bool:
        latest = self.latest()
        return len(latest) == len(self._probes) and all(v is ready for v in latest.values())

    def none_ready(self) -> bool:
        """No surface says ready (each says not ready, or nothing answers there)."""
        latest = self.latest()
        return len(latest) == len(self._probes) and not any(latest.values())

    def answered_ready_after(self, since: float, until: float = float("inf")) -> list[str]:
        """The surfaces that said ready at some point after `since` (and before `until`)."""
        return [n for n, s in self.samples.items() if any(since < t < until and v for t, v in s)]


def _instances(etcd: EtcdServer, namespace: str) -> list[str]:
    return [k for k in etcd_keys(etcd.endpoint) if k.startswith(f"v1/instances/{namespace}/")]


def _answers_from(pids: set[int], since: float) -> Callable[[list[Outcome]], bool]:
    def seen(outcomes: list[Outcome]) -> bool:
        return pids <= {o.value for o in outcomes if o.ok and o.sent > since}

    return seen


@pytest.mark.parametrize(
    "door, plane, on_loss",
    [("triton", "tcp", "restart"), ("dynamo", "nats", "exit")],
    ids=["triton-tcp-restarts-itself", "dynamo-nats-exits"],
)
def test_etcd_outages_short_and_past_the_lease(
    door: str, plane: str, on_loss: str, tmp_path: Path, etcd: EtcdServer, nats: NatsServer
) -> None:
    env = {"ETCD_LEASE_TTL": str(LEASE_TTL_S)}
    if on_loss == "exit":
        env["DYN_BRIDGE_EXIT_ON_LEASE_LOSS"] = "true"
    cluster = Cluster(
        tmp_path / "cluster",
        discovery="etcd",
        request_plane=plane,
        etcd_endpoint=etcd.endpoint,
        nats_url=nats.url,
        extra_env=env,
    )
    control_port = free_port()
    frontend = cluster.frontend("--control-port", str(control_port), "--frontend", door)
    workers = [cluster.worker(SCALE_OUT, name=f"worker_{n}") for n in "ab"]
    processes = [frontend, *workers]
    try:
        start_all(processes)
        frontend.wait_model_ready("whoami")
        pids = {w.pid for w in workers}
        load = LoadGenerator(
            frontend.grpc_url, "whoami", one_value, threads=2, max_seconds=240,
            client_timeout=5, keep=pid_of, parameters={"delay_ms": 20},
            pause_after_failure=0.1,
        )  # fmt: skip
        with load, Readiness(frontend, control_port, workers, door == "triton") as readiness:
            load.wait_for(_answers_from(pids, 0.0), "answers from both workers")
            wait_until(lambda: readiness.all_are(True), "every surface ready")

            # A short outage: not ready while etcd is away, nothing lost, ready again after.
            etcd.stop()
            stopped = time.monotonic()
            wait_until(lambda: readiness.all_are(False), "every surface not ready", timeout=10)
            etcd.restart()
            restarted = time.monotonic()
            wait_until(lambda: readiness.all_are(True), "every surface ready again", timeout=20)
            assert all(p.running for p in processes), [p.log_tail() for p in processes]
            load.wait_for(_answers_from(pids, restarted), "answers from both after the outage")
            short = [o for o in load.snapshot() if o.sent > stopped]
            assert all(o.ok for o in short), describe(short)
            print(
                f"\nshort outage ({restarted - stopped:.1f} s): every surface not ready, then "
                f"ready; {len(short)} requests since, all answered"
            )

            # Past the lease: Dynamo shuts each runtime down; each process says so, and either
            # starts again by itself once etcd answers, or exits 1 (--exit-on-lease-loss).
            logs = {p.name: len(p.log_text) for p in processes}
            etcd.stop()
            stopped = time.monotonic()
            if on_loss == "restart":
                _restarts_by_itself(etcd, processes, workers, load, readiness, logs, stopped)
                return
            wait_until(
                lambda: not any(p.running for p in processes),
                "every process to exit after its lease",
                timeout=3 * LEASE_TTL_S + 10,
            )
            exited = time.monotonic()
        codes = {p.name: p.wait_exit(timeout=30) for p in processes}
        # Said not ready while still alive, and never ready again once etcd had been away for a
        # probe interval (a probe in flight at the stop may still have answered ready).
        said_not_ready = {
            name for name, samples in readiness.samples.items()
            if any(t > stopped and v is False for t, v in samples)
        }  # fmt: skip
        assert said_not_ready == set(readiness.samples), readiness.samples
        assert not readiness.answered_ready_after(stopped + 3), readiness.latest()
        assert codes == {p.name: 1 for p in processes}, [p.log_tail() for p in processes]
        for process in processes:
            text = process.log_text[logs[process.name] :]
            assert text.count(UNREACHABLE_TEXT) == 1, (process.name, text[-3000:])
            assert text.count(LOST_TEXT) == 1, (process.name, text[-3000:])
        print(f"past the lease: every process exited with status 1 {exited - stopped:.1f} s in")

        # etcd back; the orchestrator restarts the processes: the models serve again. etcd
        # restores the old leases, so the dead processes' instances stay listed for one more
        # lease: the triton door leaves them out; Dynamo's routing tries them until they end.
        etcd.restart()
        stale = set(_instances(etcd, cluster.namespace))
        start_all(processes)
        frontend.wait_model_ready("whoami")
        pids = {w.pid for w in workers}
        with LoadGenerator(
            frontend.grpc_url, "whoami", one_value, threads=2, max_seconds=60,
            client_timeout=5, keep=pid_of,
        ) as again:  # fmt: skip
            again.wait_for(_answers_from(pids, 0.0), "answers from both restarted workers")
            settled = time.monotonic()
            if door == "dynamo":
                wait_until(
                    lambda: not stale & set(_instances(etcd, cluster.namespace)),
                    "the dead processes' instances to leave discovery",
                    timeout=LEASE_TTL_S + 15,
                )
                # Dynamo's frontend hears of it through its own watch of etcd, a moment later;
                # the requests sent since then are the ones that must all be answered.
                settled = time.monotonic() + WATCH_LAG_S
            lingering = len(stale & set(_instances(etcd, cluster.namespace)))
            again.wait_for(
                lambda o: sum(x.sent > settled for x in o) >= 20, "20 more answers sent since"
            )
        tail = [o for o in again.snapshot() if o.sent > settled]
        assert all(o.ok for o in tail), describe(tail)
        if door == "triton":  # it never sent a request to a dead instance's failure
            assert not again.failures(), describe(again.snapshot())
        print(
            f"restarted: {describe(again.snapshot())} of {len(again.snapshot())}; the last "
            f"{len(tail)} all answered with {lingering} dead instances still listed"
        )
    finally:
        cluster.stop()


def _restarts_by_itself(
    etcd: EtcdServer,
    processes: list[Any],
    workers: list[Worker],
    load: LoadGenerator,
    readiness: Readiness,
    logs: dict[str, int],
    stopped: float,
) -> None:
    """Past the lease with the default: every process says the lease is lost, is not ready
    (its ports close) while etcd stays away, and once etcd is back serves again as the same
    process (same pid: re-executed), with nobody restarting it."""
    pids = {p.name: p.pid for p in processes}
    wait_until(
        lambda: all(LOST_TEXT in p.log_text[logs[p.name] :] for p in processes),
        "every process to say its lease is lost",
        timeout=3 * LEASE_TTL_S + 10,
    )
    lost = time.monotonic()
    wait_until(readiness.none_ready, "every surface not ready (or closed)", timeout=30)
    assert all(p.running for p in processes), [p.log_tail() for p in processes]
    etcd.restart()
    back = time.monotonic()
    wait_until(lambda: readiness.all_are(True), "every surface ready again", timeout=120)
    load.wait_for(_answers_from({w.pid for w in workers}, back), "answers from both workers")
    assert {p.name: p.pid for p in processes} == pids  # the same processes: nobody restarted them
    assert all(p.running for p in processes)
    assert not readiness.answered_ready_after(stopped + 3, until=back), readiness.latest()
    for process in processes:
        text = process.log_text[logs[process.name] :]
        assert text.count(LOST_TEXT) == 1, (process.name, text[-3000:])
        assert "starting this process again" in text, (process.name, text[-3000:])
    settled = time.monotonic()  # the requests sent since (not those answered since)
    load.wait_for(lambda o: sum(x.sent > settled for x in o) >= 20, "20 more answers sent since")
    tail = [o for o in load.snapshot() if o.sent > settled]
    assert all(o.ok for o in tail), describe(tail)
    print(
        f"past the lease: lost {lost - stopped:.0f} s in, every process re-executed itself "
        f"once etcd was back; {len(tail)} answers since, all ok"
    )


def test_worker_restarted_alone_is_served_by_the_same_frontend(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """A worker SIGKILLed and started again, the frontend left alone: the frontend drops the dead
    instance and serves from the new one."""
    cluster = Cluster(
        tmp_path / "cluster",
        discovery="etcd",
        etcd_endpoint=etcd.endpoint,
        extra_env={"ETCD_LEASE_TTL": str(LEASE_TTL_S)},
    )
    frontend = cluster.frontend("--frontend", "triton")
    worker = cluster.worker(SCALE_OUT, name="worker")
    try:
        start_all([frontend, worker])
        frontend.wait_model_ready("whoami")
        door_pid, first = frontend.pid, worker.pid
        client = frontend.client()
        assert pid_of(client.infer("whoami", one_value())) == first
        worker.kill()
        worker.start()
        second = worker.pid

        def served() -> bool:
            try:
                return pid_of(client.infer("whoami", one_value(), client_timeout=5)) == second
            except Exception:  # the dead instance, or not discovered yet
                return False

        wait_until(
            served, "the restarted worker to answer through the same frontend", 3 * LEASE_TTL_S
        )
        assert frontend.running and frontend.pid == door_pid
        # The killed worker's instances are still listed (its lease has not ended): the door
        # must leave them out, for requests and for its readiness alike.
        listed = [k for k in etcd_keys(etcd.endpoint) if "/bridge/control/" in k]
        assert len(listed) == 2, listed
        answers = [pid_of(client.infer("whoami", one_value())) for _ in range(20)]
        assert answers == [second] * 20
        assert client.is_server_ready()
    finally:
        cluster.stop()
