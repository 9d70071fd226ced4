"""The etcd probe behind readiness under discovery faults (bridge/roles/discovery.py), against a
real etcd: it answers; stopped, it does not; frozen (SIGSTOP: it still accepts connections but
never answers), it does not either; back, it answers again. `restart()` of the harness brings etcd
back on the same address, as the e2e outage tests need."""

from __future__ import annotations

import asyncio
import os
import signal
import time
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


def wait_stopped(pid: int, timeout: float = 10.0) -> None:
    """Until every thread of `pid` is stopped: a SIGSTOP is delivered asynchronously, and on a
    busy machine a thread of etcd may still answer one request after kill() returned."""
    deadline = time.monotonic() + timeout
    while True:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                stat = Path(f"/proc/{pid}/task/{task}/stat").read_text()
            except FileNotFoundError:  # a thread that ended meanwhile
                continue
            states.append(stat[stat.rindex(")") + 2])
        if all(state in "tT" for state in states):
            return
        assert time.monotonic() < deadline, f"etcd's threads not stopped: {states}"
        time.sleep(0.01)


def test_probe_follows_etcd_up_frozen_down_and_back(tmp_path: Path) -> None:
    require_service("etcd")
    etcd = EtcdServer(tmp_path / "etcd").start()
    try:
        endpoint = etcd.endpoint
        assert probe(endpoint)
        assert etcd.process is not None
        etcd.process.send_signal(signal.SIGSTOP)
        try:
            wait_stopped(etcd.process.pid)
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
