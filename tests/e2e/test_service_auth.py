"""etcd and NATS with authentication (issue 38 finding 5), and lost leases in a row.

Before the fix, with an etcd without auth any local user could revoke the leases; each revoke was
a full outage while every process re-executed, 4 times a minute. Now:

* a worker and a frontend serve through an etcd with auth on and a NATS that takes only its
  users, given Dynamo's variables (ETCD_AUTH_*, NATS_AUTH_*); nothing of etcd is readable
  without them;
* without the credentials, or with wrong ones, the process refuses to start with one line
  naming the variable (Dynamo alone gave a traceback, or retried for about 120 s);
* revoking the leases again and again (what a local user can do to an etcd without auth) makes
  the process back off between re-executions, one line each time.

Real etcd and nats-server on free ports (tests/harness/services.py), real bridge processes
(tests/harness/cluster.py), real tritonclient. Everything is bounded in time.
"""

from __future__ import annotations

import re
import subprocess
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.roles.discovery import BACKOFF_FIRST_S
from tests.e2e.support import REPOSITORIES, WAIT_S, fp32_input, wait_until
from tests.harness.cluster import Cluster
from tests.harness.services import (
    EtcdServer,
    NatsServer,
    etcd_keys,
    nats_connections,
    require_service,
    revoke_leases,
)

SCALE_OUT = REPOSITORIES / "scale_out"
ETCD_LOGIN = ("bridge", "etcd-s3cret")
NATS_LOGIN = ("bridge", "nats-s3cret")
LOST_TEXT = "shut this process's runtime down"
AGAIN_TEXT = "starting this process again (same pid"
LEASE_TTL_S = 3
BACKOFF_LINE = re.compile(r"backing off (\d+) s before starting this process again")


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    require_service("etcd")
    with EtcdServer(tmp_path / "etcd") as server:
        yield server


@pytest.fixture
def locked(etcd: EtcdServer, tmp_path: Path) -> Iterator[tuple[EtcdServer, NatsServer]]:
    """etcd with auth on and a NATS that takes only its user."""
    require_service("nats-server")
    etcd.enable_auth(*ETCD_LOGIN)
    with NatsServer(tmp_path / "nats", users=dict([NATS_LOGIN])) as nats:
        yield etcd, nats


def _cluster(tmp_path: Path, etcd: EtcdServer, nats: NatsServer | None = None) -> Cluster:
    return Cluster(
        tmp_path / "cluster",
        discovery="etcd",
        request_plane="nats" if nats else "tcp",
        etcd_endpoint=etcd.endpoint,
        nats_url=nats.url if nats else None,
    )


def test_a_worker_and_a_frontend_serve_through_etcd_auth_and_a_nats_user(
    tmp_path: Path, locked: tuple[EtcdServer, NatsServer]
) -> None:
    etcd, nats = locked
    cluster = _cluster(tmp_path, etcd, nats)
    cluster.extra_env.update({**etcd.auth_environ(), **nats.auth_environ()})
    frontend = cluster.frontend("--frontend", "triton")
    worker = cluster.worker(SCALE_OUT)
    try:
        worker.start()
        frontend.start()
        frontend.wait_model_ready("whoami")
        result = frontend.client().infer("whoami", [fp32_input([1.0])])
        assert int(result.as_numpy("PID")[0]) == worker.pid
        listed = etcd_keys(etcd.endpoint, auth=ETCD_LOGIN, prefix="v1/")  # its role's keys
        assert any(k.startswith(f"v1/instances/{cluster.namespace}/") for k in listed), listed
        assert nats_connections(nats) >= 2  # both processes logged in to NATS
        with pytest.raises(urllib.error.HTTPError):  # nobody else reads Dynamo's records
            etcd_keys(etcd.endpoint, prefix="v1/")
        with pytest.raises(urllib.error.HTTPError):  # nor revokes its leases
            revoke_leases(etcd.endpoint)
        assert frontend.client().infer("whoami", [fp32_input([2.0])]).as_numpy("PID")[0]
    finally:
        cluster.stop()


@pytest.mark.parametrize(
    "drop, wrong, expected",
    [
        ("ETCD_AUTH_USERNAME", None, "requires authentication: set ETCD_AUTH_USERNAME and"),
        (None, "ETCD_AUTH_PASSWORD", "refused ETCD_AUTH_USERNAME=bridge with ETCD_AUTH_PASSWORD"),
        ("NATS_AUTH_USERNAME", None, "requires authentication (Authorization Violation): set NATS"),
        (None, "NATS_AUTH_PASSWORD", "refused NATS_AUTH_USERNAME=bridge with NATS_AUTH_PASSWORD"),
    ],
    ids=["no-etcd-login", "wrong-etcd-password", "no-nats-login", "wrong-nats-password"],
)
def test_without_the_credentials_the_start_fails_with_one_line(
    tmp_path: Path,
    locked: tuple[EtcdServer, NatsServer],
    drop: str | None,
    wrong: str | None,
    expected: str,
) -> None:
    etcd, nats = locked
    env = {**etcd.auth_environ(), **nats.auth_environ()}
    if drop is not None:  # the pair goes: Dynamo reads them only together
        env.pop(drop)
        env.pop(drop.replace("USERNAME", "PASSWORD"))
    if wrong is not None:
        env[wrong] = "not-the-password"
    worker = _cluster(tmp_path, etcd, nats).worker(SCALE_OUT)
    environ = worker.environ()
    for name in ("ETCD_AUTH_USERNAME", "ETCD_AUTH_PASSWORD", "NATS_AUTH_USERNAME"):
        environ.pop(name, None)
    environ.update(env)
    try:
        done = subprocess.run(
            worker.command(), env=environ, capture_output=True, text=True, timeout=WAIT_S
        )
    except subprocess.TimeoutExpired:
        raise AssertionError("no start-up error: still trying to log in") from None
    output = done.stdout + done.stderr
    errors = [line for line in output.splitlines() if re.match(r"^E\d{4} ", line)]
    assert done.returncode == 1, output[-3000:]
    assert len(errors) == 1 and expected in errors[0], output[-3000:]
    assert "Traceback" not in output
    assert "+-------" not in output  # refused before loading any model


def test_leases_revoked_again_and_again_back_off(tmp_path: Path, etcd: EtcdServer) -> None:
    """What any local user can do to an etcd without auth: revoke every lease, three times, each
    once the worker serves again. The first loss re-executes at once; the next ones wait 1 s,
    then 2 s, saying so in one line each."""
    cluster = _cluster(tmp_path, etcd)
    # Dynamo sees a revoked lease at its next keep-alive, sooner with a shorter TTL.
    cluster.extra_env["ETCD_LEASE_TTL"] = str(LEASE_TTL_S)
    worker = cluster.worker(SCALE_OUT)
    try:
        worker.start()
        pid = worker.pid
        delays = []
        for loss in range(1, 4):
            assert revoke_leases(etcd.endpoint) >= 1
            revoked = time.monotonic()
            wait_until(
                lambda n=loss: worker.log_text.count(AGAIN_TEXT) == n,
                f"re-execution {loss}",
                timeout=60,
            )
            wait_until(lambda: worker.health() == 200, f"serving after re-execution {loss}", 60)
            delays = [int(s) for s in BACKOFF_LINE.findall(worker.log_text)]
            assert len(delays) == loss - 1, worker.log_tail()
            print(f"loss {loss}: serving again {time.monotonic() - revoked:.1f} s after the revoke")
        assert worker.log_text.count(LOST_TEXT) == 3
        assert delays == [int(BACKOFF_FIRST_S), int(2 * BACKOFF_FIRST_S)]
        assert worker.pid == pid and worker.running  # the same process, re-executed
    finally:
        worker.stop()
