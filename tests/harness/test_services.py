"""Self-test of tests/harness/services.py: real etcd and nats-server start on free loopback
ports, answer, and are gone after stop()."""

from __future__ import annotations

from pathlib import Path

from tests.harness.ports import port_is_open
from tests.harness.services import (
    EtcdServer,
    NatsServer,
    etcd_keys,
    nats_connections,
    require_service,
)


def test_etcd_and_nats_start_answer_and_stop(tmp_path: Path) -> None:
    require_service("etcd")
    require_service("nats-server")
    etcd, nats = EtcdServer(tmp_path / "etcd"), NatsServer(tmp_path / "nats")
    with etcd, nats:
        assert etcd.endpoint.startswith("http://127.0.0.1:")
        assert nats.url.startswith("nats://127.0.0.1:")
        assert etcd_keys(etcd.endpoint) == []  # a fresh data dir
        assert nats_connections(nats) == 0
        processes = [etcd.process, nats.process]
    assert all(p is not None and p.poll() is not None for p in processes)
    assert not port_is_open(etcd.client_port)
    assert not port_is_open(nats.port)
