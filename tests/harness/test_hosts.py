"""Self-test of tests/harness/hosts.py: simulated hosts reach each other over their bridge, a cut
host reaches nobody and nobody reaches it (both modes) until restored, and nothing is left once
the Network closes, also when the test fails inside it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.harness.hosts import HostProcess, Network, _ip, accepts, require_hosts

PORT = 8000


def listener(host_network: Network, name: str) -> HostProcess:
    """A TCP server on host `name`'s address, port PORT."""
    host = host_network[name]
    server = host.spawn(
        [sys.executable, "-m", "http.server", "--bind", host.address, str(PORT)],
        name="http.server",
    )
    server.wait_port(PORT)
    return server


def names_left(network: Network) -> list[str]:
    """The network's namespaces and links that still exist."""
    namespaces = _ip("netns", "list").stdout
    links = _ip("-o", "link", "show").stdout
    wanted = [network.bridge, *(f"{network.bridge}v{i}" for i in range(len(network.names)))]
    left = [n for n in (f"dbh-{network.pid}-{h}" for h in network.names) if n in namespaces]
    return left + [n for n in wanted if f" {n}:" in links or f" {n}@" in links]


@pytest.mark.parametrize("mode", ["drop", "link"])
def test_hosts_reach_each_other_until_cut(mode: str, tmp_path: Path) -> None:
    require_hosts()
    network = Network(["a", "b"], workdir=tmp_path)
    with network:
        a, b = network["a"], network["b"]
        assert a.address != b.address and network.subnet is not None
        server, other = listener(network, "b"), listener(network, "a")
        assert a.connects(b.address, PORT) and b.connects(a.address, PORT)
        assert accepts(b.address, PORT)  # the test's namespace reaches it over the bridge
        # Loopback inside a host is its own: a's loopback does not hold b's server.
        assert not a.connects("127.0.0.1", PORT)

        b.cut(mode)  # type: ignore[arg-type]
        assert not a.connects(b.address, PORT, timeout=1.0)
        assert not accepts(b.address, PORT, timeout=1.0)
        assert not b.connects(a.address, PORT, timeout=1.0)  # both ways
        b.restore()
        assert a.connects(b.address, PORT, timeout=5.0)
        assert server.running() and other.running()
    assert server.returncode is not None  # stopped by close()
    assert names_left(network) == []


def test_close_removes_everything_after_a_failure(tmp_path: Path) -> None:
    require_hosts()
    network = Network(["a"], workdir=tmp_path)
    with pytest.raises(RuntimeError, match="the test failed"), network:
        server = listener(network, "a")
        network["a"].cut()
        raise RuntimeError("the test failed")
    assert not server.running()
    assert names_left(network) == []
