"""The etcd probe behind readiness under discovery faults (bridge/roles/discovery.py), against a
real etcd: it answers; stopped, it does not; frozen (SIGSTOP: it still accepts connections but
never answers), it does not either; back, it answers again. `restart()` of the harness brings etcd
back on the same address, as the e2e outage tests need."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from bridge.roles.discovery import etcd_answers, scheme_of
from bridge.roles.runtime import needed_services
from tests.harness.services import EtcdServer, etcd_keys, require_service


def probe(endpoint: str) -> bool:
    (service,) = needed_services("etcd", "tcp", {"ETCD_ENDPOINTS": endpoint})
    checks = [etcd_answers(scheme_of(service.value), h, p) for h, p in service.addresses]

    async def any_answers() -> bool:
        return any(await asyncio.gather(*checks))

    return asyncio.run(any_answers())


def test_probe_follows_etcd_up_frozen_down_and_back(tmp_path: Path) -> None:
    require_service("etcd")
    etcd = EtcdServer(tmp_path / "etcd").start()
    try:
        endpoint = etcd.endpoint
        assert probe(endpoint)
        assert etcd.process is not None
        etcd.process.send_signal(signal.SIGSTOP)
        try:
            assert not probe(endpoint)  # accepts (the kernel's backlog), answers nothing
        finally:
            etcd.process.send_signal(signal.SIGCONT)
        assert probe(endpoint)
        etcd.stop()
        assert not probe(endpoint)
        etcd.restart()
        assert etcd.endpoint == endpoint
        assert probe(endpoint)
        assert etcd_keys(endpoint) == []
    finally:
        etcd.stop()


def test_scheme_of_the_first_endpoint() -> None:
    assert scheme_of("http://a:2379,https://b:2379") == "http"
    assert scheme_of(" https://a:2379") == "https"
    assert scheme_of("a:2379") == "http"  # Dynamo's form without a scheme
