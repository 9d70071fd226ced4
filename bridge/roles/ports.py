"""The ports a process listens on, checked before anything slow and before any model is registered.

A start-up must be all or nothing (issue 23): a process that registered its models with Dynamo
and then died on `address already in use` left its registration behind, and frontends routed
requests to a process that was gone. So every port this process will bind (the door's gRPC and
HTTP ports, the metrics port, the control port) is tried first, with a socket bound and closed at
once, and a port that cannot be bound stops the start-up with one line naming the flag and the
value (`--metrics-port 8002 is in use`). The servers bind for real later; the composition root
(bridge/server.py) checks again right before it registers the models, so the window in which
another process could take a port is the registration's, not the models' loading time.

The probe sets SO_REUSEADDR as the servers do (a port in TIME_WAIT is free) and never
SO_REUSEPORT: on Linux a socket listening with SO_REUSEPORT (grpc's default) still refuses it.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

from ..options import ServerOptions
from .runtime import RuntimeSettingsError

# Dynamo 1.6's KServe frontend binds its gRPC port on every interface, whatever --host says.
DYNAMO_GRPC_ADDRESS = "0.0.0.0"
CONTROL_ADDRESS = "127.0.0.1"  # bridge/control/port.py


class PortUnavailable(RuntimeSettingsError):
    """A port this process needs cannot be bound; str() is the one line to log."""


@dataclass(frozen=True, slots=True)
class Listener:
    port_flag: str  # `--metrics-port`
    address_flag: str | None  # `--metrics-address`; None when the address is not the user's
    address: str
    port: int


def listeners(options: ServerOptions) -> list[Listener]:
    """Every port this process will listen on, as the options say."""
    found = []
    if options.allow_metrics:
        metrics = options.metrics_address, options.metrics_port
        found.append(Listener("--metrics-port", "--metrics-address", *metrics))
    if options.control_port is not None:
        found.append(Listener("--control-port", None, CONTROL_ADDRESS, options.control_port))
    return found + door_listeners(options)


def door_listeners(options: ServerOptions) -> list[Listener]:
    """The door's ports (none for `--role worker`): bound when the door starts serving, after
    the models are registered, so that ServerLive comes with the models, as in Triton."""
    if options.role == "worker":
        return []
    if options.door is None:
        return [Listener("--grpc-port", None, DYNAMO_GRPC_ADDRESS, options.grpc_port)]
    found = [Listener("--grpc-port", "--host", options.host, options.grpc_port)]
    if options.http is not None:
        http = options.http
        found.append(Listener("--http-port", "--http-address", http.address, http.port))
    return found


def check_free(wanted: list[Listener]) -> None:
    """PortUnavailable, naming the flag and the value, unless every port can be bound now.
    Port 0 (any free port) is always free."""
    for listener in wanted:
        port = listener.port
        if not 0 <= port <= 65535:
            raise PortUnavailable(
                f"{listener.port_flag} {port} is not a port (1 to 65535, or 0 for any free one)"
            )
        if port == 0:
            continue
        _probe(listener)


def _probe(listener: Listener) -> None:
    address = listener.address.strip("[]")
    where = (
        f"{listener.address_flag} {listener.address}"
        if listener.address_flag is not None
        else listener.address
    )
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            address, listener.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror:
        raise PortUnavailable(f"{where} is not an address of this host") from None
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(sockaddr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortUnavailable(f"{listener.port_flag} {listener.port} is in use") from None
            if exc.errno == errno.EADDRNOTAVAIL:
                raise PortUnavailable(f"{where} is not an address of this host") from None
            raise PortUnavailable(
                f"{listener.port_flag} {listener.port}: cannot listen on {listener.address}: "
                f"{exc.strerror or exc}"
            ) from None
