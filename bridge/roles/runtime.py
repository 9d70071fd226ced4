"""Constructing Dynamo's runtime for a role: reachability of etcd and NATS, request-plane address.

`DistributedRuntime(loop, discovery, request_plane)` connects to etcd (discovery `etcd`) and to
NATS (request plane `nats`, or any process where `NATS_SERVER` is set) inside its constructor.
When either cannot be reached, Dynamo 1.6.1 retries there for about 120 s, logging only a
warning per attempt, and the process serves nothing meanwhile (spec dynamo_runtime.md §5, §8).
So the bridge first opens a TCP connection to each service it needs, with a short timeout, and
stops with one line naming the variable and the address when none answers; then it logs in as
Dynamo will (credentials.py: ETCD_AUTH_*, NATS_AUTH_*, NATS_TLS_*), for the same reason.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from dynamo.runtime import DistributedRuntime

from .credentials import CredentialsError, check_credentials

log = logging.getLogger("dynamo_bridge")

# Dynamo's defaults when the variables are unset.
ETCD_DEFAULT = "http://localhost:2379"
NATS_DEFAULT = "nats://localhost:4222"
# Start-up's check that etcd / NATS accept a connection: a reachable service accepts within
# milliseconds; one that takes seconds is reported rather than waited for.
CONNECT_TIMEOUT_S = 3.0

# The request plane's listening addresses (worker side, and the response streams of a caller).
_REQUEST_PLANE_HOSTS = ("DYN_TCP_RPC_HOST", "DYN_TCP_RESPONSE_STREAM_HOST")


class RuntimeSettingsError(Exception):
    """Dynamo's runtime cannot start with these settings; str() is the one line to log."""


class ServiceUnreachable(RuntimeSettingsError):
    """etcd or NATS, needed by this process, does not accept connections."""


# Dynamo 1.6.1 parses DYN_SYSTEM_PORT as a signed 16-bit number (measured: 37481 is refused
# when the runtime starts, after the models have loaded).
SYSTEM_PORT_MAX = 32767


@dataclass(frozen=True, slots=True)
class Service:
    variable: str  # the environment variable that names it
    value: str  # as given, or Dynamo's default
    defaulted: bool  # the variable is unset: `value` is Dynamo's default
    addresses: tuple[tuple[str, int], ...]


def _addresses(value: str, default_port: int) -> tuple[tuple[str, int], ...]:
    found = []
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        parts = urlsplit(item if "://" in item else f"tcp://{item}")
        found.append((parts.hostname or "localhost", parts.port or default_port))
    return tuple(found)


def needed_services(
    discovery: str, request_plane: str, environ: Mapping[str, str]
) -> list[Service]:
    """The external services Dynamo will connect to at construction, as it would find them."""
    services = []
    if discovery == "etcd":
        value = environ.get("ETCD_ENDPOINTS") or ETCD_DEFAULT
        services.append(
            Service("ETCD_ENDPOINTS", value, value == ETCD_DEFAULT, _addresses(value, 2379))
        )
    # With NATS_SERVER set Dynamo connects to NATS whatever the backends (measured with mem,
    # file and etcd); unset, only the nats request plane needs it (spec §5: etcd + tcp runs
    # without NATS as long as NATS_SERVER is unset).
    if request_plane == "nats" or environ.get("NATS_SERVER"):
        value = environ.get("NATS_SERVER") or NATS_DEFAULT
        services.append(
            Service("NATS_SERVER", value, not environ.get("NATS_SERVER"), _addresses(value, 4222))
        )
    return services


async def _accepts(host: str, port: int, timeout: float) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, asyncio.TimeoutError):
        return False
    writer.close()
    return True


async def check_reachable(services: list[Service], timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Raise ServiceUnreachable unless one address of every service accepts a connection."""
    for service in services:
        checks = [_accepts(host, port, timeout) for host, port in service.addresses]
        if not any(await asyncio.gather(*checks)):
            what = "etcd" if service.variable == "ETCD_ENDPOINTS" else "NATS"
            raise ServiceUnreachable(
                f"cannot reach {what} at {service.value} ({service.variable}"
                f"{' unset, Dynamo default' if service.defaulted else ''}): "
                f"no connection within {timeout:.0f} s"
            )


def place_request_plane(
    discovery: str, request_plane: str, role: str, environ: MutableMapping[str, str]
) -> None:
    """Where the TCP request plane listens. Unset, Dynamo binds an interface of its choosing.

    `mem` and `file` discovery are one host: pin to loopback unless the user chose otherwise.
    With etcd or kubernetes other hosts must reach this process, so the address is the user's
    to give (a routable one); say so once when it is missing: DYN_TCP_RPC_HOST where a process
    serves endpoints (worker, all), DYN_TCP_RESPONSE_STREAM_HOST where a frontend takes the
    responses back.
    """
    if discovery in ("mem", "file"):
        for variable in _REQUEST_PLANE_HOSTS:
            environ.setdefault(variable, "127.0.0.1")
        return
    if request_plane != "tcp":
        return
    variable = "DYN_TCP_RESPONSE_STREAM_HOST" if role == "frontend" else "DYN_TCP_RPC_HOST"
    if not environ.get(variable):
        log.warning(
            "%s is not set: Dynamo picks an interface of this host on its own for the request "
            "plane; set it to an address the other hosts can reach (docs/deployment.md)",
            variable,
        )


def check_system_port(environ: Mapping[str, str]) -> None:
    """DYN_SYSTEM_PORT, if set, is a port Dynamo accepts."""
    value = environ.get("DYN_SYSTEM_PORT")
    if value is None:
        return
    try:
        port = int(value)
    except ValueError:
        port = -1
    if not 0 <= port <= SYSTEM_PORT_MAX:
        raise RuntimeSettingsError(
            f"DYN_SYSTEM_PORT={value}: Dynamo's system status server takes a port from 0 to "
            f"{SYSTEM_PORT_MAX} (0: any free port)"
        )


async def check_services(discovery: str, request_plane: str) -> None:
    """Before anything slow (loading models): the settings the runtime reads are valid, the
    services it will need answer, and take this process's credentials (credentials.py)."""
    check_system_port(os.environ)
    services = needed_services(discovery, request_plane, os.environ)
    await check_reachable(services)
    try:
        await check_credentials(services, os.environ, CONNECT_TIMEOUT_S)
    except CredentialsError as exc:
        raise RuntimeSettingsError(str(exc)) from None


def start_runtime(discovery: str, request_plane: str, role: str) -> DistributedRuntime:
    """Dynamo's runtime on the running loop, its request plane placed (after check_services)."""
    place_request_plane(discovery, request_plane, role, os.environ)
    return DistributedRuntime(asyncio.get_running_loop(), discovery, request_plane)
