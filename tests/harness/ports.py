"""Free TCP ports on the loopback interface, and waiting for a server to listen on one."""

from __future__ import annotations

import random
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

LOCALHOST = "127.0.0.1"


def _bindable(port: int, host: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _below_ephemeral() -> range:
    """The ports below the kernel's ephemeral range (from 10000): the kernel never gives one of
    them to an outgoing connection."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return range(10000, max(low, 20000))


def free_port(port_range: Iterable[int] | None = None, host: str = LOCALHOST) -> int:
    """A TCP port nobody listens on right now, tried in random order from `port_range`, so two
    runs sharing a range rarely race for the same port.

    By default from below the kernel's ephemeral range: a port the kernel picked (bind to port
    0) is an ephemeral one, which an outgoing connection of any process (a test's clients, the
    servers' own connections) could take between the pick and the server's bind; on a busy run
    (thousands of connections in TIME_WAIT) servers failed to start with "is in use".
    """
    candidates = list(port_range if port_range is not None else _below_ephemeral())
    random.shuffle(candidates)
    for port in candidates:
        if _bindable(port, host):
            return port
    raise RuntimeError(f"no free TCP port on {host} in the given range")


def free_ports(
    count: int, port_range: Iterable[int] | None = None, host: str = LOCALHOST
) -> list[int]:
    """`count` distinct free ports (a server usually needs several at once)."""
    ports: list[int] = []
    attempts = 0
    while len(ports) < count:
        attempts += 1
        if attempts > count * 50:
            raise RuntimeError(f"could not find {count} distinct free ports on {host}")
        port = free_port(port_range, host)
        if port not in ports:
            ports.append(port)
    return ports


def port_is_open(port: int, host: str = LOCALHOST, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for_port(
    port: int,
    host: str = LOCALHOST,
    timeout: float = 30.0,
    process: subprocess.Popen | None = None,
) -> None:
    """Block until host:port accepts connections.

    Raises TimeoutError after `timeout` seconds, or RuntimeError as soon as `process` (the
    server expected to open the port) has exited, so a crashed server does not cost the whole
    timeout.
    """
    deadline = time.monotonic() + timeout
    while True:
        if port_is_open(port, host):
            return
        if process is not None and process.poll() is not None:
            raise RuntimeError(
                f"process {process.pid} exited with code {process.returncode} "
                f"before listening on {host}:{port}"
            )
        if time.monotonic() >= deadline:
            raise TimeoutError(f"nothing listened on {host}:{port} within {timeout:.0f} s")
        time.sleep(0.05)
