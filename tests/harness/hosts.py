"""Several simulated hosts on one machine: network namespaces on a Linux bridge, for the
multi-host tests (issue 39) and the partition tests and benchmarks built on them.

`Network(["a", "b", "c", "client"])` makes, as root:

* a bridge `dbh<pid>` in this (the test's) namespace, with the first address of a private
  /24 in 10.213.0.0/16 that no interface or route of the machine uses yet, so the test
  process reaches every host directly (it polls their ports and scrapes their metrics);
* one network namespace per host, `dbh-<pid>-<name>`, holding `lo` and an `eth0` (one end of a
  veth pair; the other end, `dbh<pid>v<i>`, is a port of the bridge) with the host's address.
  No default route unless asked (`default_route=True`: through the bridge's address): a host
  reaches the subnet and nothing else, so a packet meant elsewhere fails at once ("Network is
  unreachable") and never leaves the machine, even where this machine forwards packets.

A host's name lookups go to a resolver on its own loopback (`/etc/netns/<namespace>/resolv.conf`,
which `ip netns exec` puts over /etc/resolv.conf), where nothing listens: the machine's resolver
is out of the subnet's reach, and a lookup sent there would wait out its timeouts (10 s for
Python's `socket.getfqdn()`) where a refusal answers at once.

Each `Host` starts processes inside its namespace (`spawn`: `ip netns exec`, a process group
of its own, output to a log) and can be cut off from the others and joined again (`cut`,
`restore`). Everything else is shared as it is on one machine (files, /dev/shm, pids), so a
test gives each host what a real one has of its own (the bridge's host id, data folders).

Teardown (`close`, also on a failed set-up, and at interpreter exit as a last resort) stops
every process the hosts started (then anything else still in their namespaces: only this
test's processes can be there), deletes the namespaces (which deletes their veth ends), the
bridge, and the veth ports. A run killed before its teardown leaves names with its dead pid:
the next `Network` removes those first.

`require_hosts()` skips a test (fails it under CI=true, as for etcd and Triton) when the
process is not root or `ip netns` is unavailable, with the reason.
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Literal, Self

import pytest

from .oracle import in_ci
from .process import stop_process_group

# Private addresses for the simulated hosts: one /24 per Network, chosen free at set-up.
SUBNETS = ipaddress.IPv4Network("10.213.0.0/16")
PREFIX = "dbh"  # every name this module makes starts with it (and the creator's pid)
_IP_TIMEOUT_S = 20.0
_NAME = re.compile(rf"^{PREFIX}-?(\d+)")

# How a host is cut off: "drop", the bridge stops forwarding its frames both ways while every
# link stays up (a partition behind a switch or a firewall: packets vanish, TCP retransmits
# into nothing, a connect times out); "link", its port on the bridge goes down (the host's
# eth0 loses carrier, as when a cable is pulled).
CutMode = Literal["drop", "link"]


class HostsUnavailable(RuntimeError):
    """Network namespaces cannot be made here; the message says why."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=_IP_TIMEOUT_S, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {(done.stderr or done.stdout).strip()}")
    return done


def _bridge(*args: str) -> None:
    done = subprocess.run(
        ["bridge", *args], capture_output=True, text=True, timeout=_IP_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"bridge {' '.join(args)} failed: {done.stderr.strip()}")


def hosts_unavailable_reason() -> str | None:
    """Why namespaces cannot be made by this process, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces and a bridge need root (this process is not root)"
    for tool in ("ip", "bridge"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    try:
        done = _ip("netns", "list", check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`ip netns` cannot run: {exc}"
    if done.returncode != 0:
        return f"`ip netns` is unavailable: {done.stderr.strip()}"
    return None


def require_hosts() -> None:
    """For a test: skip it (fail under CI=true) when namespaces cannot be made here."""
    reason = hosts_unavailable_reason()
    if reason is None:
        return
    if in_ci():
        pytest.fail(f"the multi-host tests are required in CI: {reason}", pytrace=False)
    pytest.skip(f"multi-host tests skipped: {reason}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Remove namespaces and links left by Networks whose process is gone (killed before its
    teardown); the names removed. Names of live processes are never touched."""
    removed = []
    for line in _ip("netns", "list").stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        found = _NAME.match(name)
        if found and name.startswith(f"{PREFIX}-") and not _alive(int(found.group(1))):
            _kill_namespace_processes(name)
            _ip("netns", "delete", name, check=False)
            shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)
            removed.append(name)
    for line in _ip("-o", "link", "show").stdout.splitlines():
        parts = line.split(":")
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        found = _NAME.match(name)
        if found and not name.startswith(f"{PREFIX}-") and not _alive(int(found.group(1))):
            _ip("link", "delete", name, check=False)
            removed.append(name)
    return removed


def _kill_namespace_processes(netns: str) -> None:
    """SIGKILL whatever still runs in `netns` (a namespace this module made for one test)."""
    done = _ip("netns", "pids", netns, check=False)
    for pid in done.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def _used_networks() -> list[ipaddress.IPv4Network]:
    used = []
    for line in _ip("-4", "-o", "addr", "show").stdout.splitlines():
        for word in line.split():
            if "/" in word and word[0].isdigit():
                used.append(ipaddress.IPv4Interface(word).network)
    for line in _ip("-4", "route", "show").stdout.splitlines():
        word = line.split()[0] if line.split() else ""
        if word[:1].isdigit():
            used.append(ipaddress.IPv4Network(word if "/" in word else f"{word}/32", strict=False))
    return used


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of SUBNETS that overlaps nothing on this machine (other tests' Networks included);
    the search starts at a place of this pid's so parallel runs rarely pick the same one."""
    used = _used_networks()
    candidates = list(SUBNETS.subnets(new_prefix=24))
    start = os.getpid() % len(candidates)
    for subnet in candidates[start:] + candidates[:start]:
        if subnet.network_address.packed[2] == 0:
            continue  # 10.213.0.0/24 is often taken by hand-made set-ups
        if not any(subnet.overlaps(other) for other in used):
            return subnet
    raise HostsUnavailable(f"no free /24 left in {SUBNETS}")


class HostProcess:
    """One process started in a host's namespace: its own process group, output in `log_path`."""

    def __init__(self, host: Host, name: str, process: subprocess.Popen[bytes], log: Path):
        self.host, self.name, self.process, self.log_path = host, name, process, log
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_until(self, check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        """Poll `check()` until true; RuntimeError with the log's tail if the process exits
        first or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while not check():
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} on host {self.host.name} exited with "
                    f"{self.process.returncode} before {what}; log {self.log_path}:\n"
                    f"{self.log_text()[-4000:]}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.name} on host {self.host.name}: not {what} after {timeout:.0f} s; "
                    f"log {self.log_path}:\n{self.log_text()[-4000:]}"
                )
            time.sleep(0.1)

    def wait_http(self, url: str, status: int = 200, timeout: float = 60.0) -> None:
        """Until GET `url` (from the test's namespace) answers `status`."""
        self.wait_until(lambda: http_status(url) == status, f"answering {status} on {url}", timeout)

    def wait_port(self, port: int, timeout: float = 60.0) -> None:
        """Until the host's address accepts a TCP connection on `port` (from the test)."""
        self.wait_until(
            lambda: accepts(self.host.address, port),
            f"listening on {self.host.address}:{port}",
            timeout,
        )

    def terminate(self) -> None:
        """SIGTERM, at once; `wait_exit` collects the status."""
        if self.running():
            self.process.send_signal(signal.SIGTERM)

    def wait_exit(self, timeout: float = 60.0) -> int:
        self.process.wait(timeout)
        return self.stop(timeout=0)

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, SIGKILL of its group after `timeout`; the exit status."""
        self.returncode = stop_process_group(self.process, timeout)
        return self.returncode


class Host:
    """One simulated host: a network namespace with `eth0` at `address` on the Network's bridge."""

    def __init__(self, network: Network, name: str, index: int, address: str) -> None:
        self.network, self.name, self.address = network, name, address
        self.netns = f"{PREFIX}-{network.pid}-{name}"
        self.port = f"{PREFIX}{network.pid}v{index}"  # its veth end on the bridge
        self.processes: list[HostProcess] = []
        self.cut_mode: CutMode | None = None

    def __repr__(self) -> str:
        return f"Host({self.name!r}, {self.address})"

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def spawn(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        name: str | None = None,
        log_path: str | os.PathLike[str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> HostProcess:
        """Start `argv` on this host with `env` (the whole environment; os.environ when None);
        stopped by the Network's close() at the latest."""
        name = name or Path(argv[0]).name
        log = Path(log_path) if log_path else self.network.workdir / f"{self.name}-{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            process = subprocess.Popen(
                self.command(argv),  # `ip netns exec` execs argv: the pid is the command's
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(os.environ if env is None else env),
                cwd=cwd,
                start_new_session=True,  # its own group: stop() reaps what it spawned
            )
        started = HostProcess(self, name, process, log)
        self.processes.append(started)
        return started

    def run(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` on this host to its end; its output and status."""
        return subprocess.run(
            self.command(argv),
            capture_output=True,
            text=True,
            env=dict(os.environ if env is None else env),
            timeout=timeout,
            check=False,
        )

    def connects(self, address: str, port: int, timeout: float = 2.0) -> bool:
        """Does a TCP connection from this host to address:port succeed within `timeout`?"""
        code = (
            "import socket,sys\n"
            "try:\n"
            f"    socket.create_connection(({address!r}, {port}), timeout={timeout}).close()\n"
            "except OSError:\n"
            "    sys.exit(1)\n"
        )
        return self.run([sys.executable, "-c", code], timeout=timeout + 10).returncode == 0

    def add_interface(self, name: str, address: str) -> None:
        """A second interface `name` with `address` (an interface address, "172.31.0.2/24") on a
        network of its own that no other host reaches: what a host whose default route or chosen
        address is on another network looks like. Removed with the namespace."""
        peer = f"{name}p"  # the other end stays in the host, unconnected
        _ip("-n", self.netns, "link", "add", name, "type", "veth", "peer", "name", peer)
        _ip("-n", self.netns, "addr", "add", address, "dev", name)
        _ip("-n", self.netns, "link", "set", peer, "up")
        _ip("-n", self.netns, "link", "set", name, "up")

    def cut(self, mode: CutMode = "drop") -> None:
        """Cut this host off from every other (and from the test's namespace), both ways."""
        if mode == "drop":
            _bridge("link", "set", "dev", self.port, "state", "0")  # disabled: drops frames
        else:
            _ip("link", "set", self.port, "down")
        self.cut_mode = mode

    def restore(self) -> None:
        """Join the host to the others again after cut()."""
        if self.cut_mode == "drop":
            _bridge("link", "set", "dev", self.port, "state", "3")  # forwarding
        elif self.cut_mode == "link":
            _ip("link", "set", self.port, "up")
        self.cut_mode = None

    def stop_processes(self, timeout: float = 15.0) -> None:
        for process in reversed(self.processes):
            process.stop(timeout)


class Network:
    """Simulated hosts named `names` on a bridge of their own; a context manager."""

    def __init__(
        self,
        names: Iterable[str],
        workdir: str | os.PathLike[str] | None = None,
        default_route: bool = False,
    ) -> None:
        self.names = list(names)
        self.default_route = default_route
        if len(set(self.names)) != len(self.names) or not self.names:
            raise ValueError(f"host names must be distinct and not none: {self.names}")
        self.pid = os.getpid()
        self.bridge = f"{PREFIX}{self.pid}"
        self.workdir = Path(workdir) if workdir else Path(f"/tmp/{PREFIX}-{self.pid}")
        self.hosts: dict[str, Host] = {}
        self.subnet: ipaddress.IPv4Network | None = None
        self.gateway = ""  # the bridge's address: the test's own on the subnet
        self._made: list[Callable[[], object]] = []  # undo steps, in the order made

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> Self:
        reason = hosts_unavailable_reason()
        if reason is not None:
            raise HostsUnavailable(reason)
        if _ip("link", "show", self.bridge, check=False).returncode == 0:
            raise HostsUnavailable(f"this process already has a Network ({self.bridge})")
        sweep_stale()
        atexit.register(self.close)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        self.subnet = _free_subnet()
        addresses = list(self.subnet.hosts())
        self.gateway = str(addresses[0])
        prefix = self.subnet.prefixlen
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made.append(partial(_ip, "link", "delete", self.bridge, check=False))
        _ip("addr", "add", f"{self.gateway}/{prefix}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for index, name in enumerate(self.names):
            host = Host(self, name, index, str(addresses[index + 1]))
            _ip("netns", "add", host.netns)
            self._made.append(partial(self._delete_namespace, host.netns))
            etc = Path("/etc/netns") / host.netns
            etc.mkdir(parents=True, exist_ok=True)
            self._made.append(partial(shutil.rmtree, etc, ignore_errors=True))
            (etc / "resolv.conf").write_text("nameserver 127.0.0.1\n")
            peer = f"{host.port}p"  # eth0's name until it is moved into the namespace
            _ip("link", "add", host.port, "type", "veth", "peer", "name", peer)
            self._made.append(partial(_ip, "link", "delete", host.port, check=False))
            _ip("link", "set", peer, "netns", host.netns)
            _ip("-n", host.netns, "link", "set", peer, "name", "eth0")
            _ip("-n", host.netns, "addr", "add", f"{host.address}/{prefix}", "dev", "eth0")
            _ip("-n", host.netns, "link", "set", "lo", "up")
            _ip("-n", host.netns, "link", "set", "eth0", "up")
            if self.default_route:
                _ip("-n", host.netns, "route", "add", "default", "via", self.gateway)
            _ip("link", "set", host.port, "master", self.bridge)
            _ip("link", "set", host.port, "up")
            self.hosts[name] = host

    @staticmethod
    def _delete_namespace(netns: str) -> None:
        _kill_namespace_processes(netns)  # a namespace with processes outlives its name
        _ip("netns", "delete", netns, check=False)

    def close(self) -> None:
        """Stop every process, remove the namespaces, veths and bridge (each step on its own:
        one failing never keeps the others from running). Safe to call twice."""
        for host in self.hosts.values():
            try:
                host.stop_processes(timeout=10.0)
            except Exception:  # keep tearing down; the namespace's processes are killed below
                pass
        while self._made:
            undo = self._made.pop()
            try:
                undo()
            except Exception:
                pass
        self.hosts.clear()
        atexit.unregister(self.close)


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """The status of GET `url`, None while nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return None


def accepts(address: str, port: int, timeout: float = 1.0) -> bool:
    """Does address:port accept a TCP connection from the test's namespace?"""
    try:
        socket.create_connection((address, port), timeout=timeout).close()
    except OSError:
        return False
    return True


__all__ = [
    "CutMode",
    "Host",
    "HostProcess",
    "HostsUnavailable",
    "Network",
    "accepts",
    "http_status",
    "hosts_unavailable_reason",
    "require_hosts",
    "sweep_stale",
]
