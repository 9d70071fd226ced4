"""Constructing Dynamo's runtime for a role: reachability of etcd and NATS, request-plane address.

`DistributedRuntime(loop, discovery, request_plane)` connects to etcd (discovery `etcd`) and to
NATS (request plane `nats`, or any process where `NATS_SERVER` is set) inside its constructor.
When either cannot be reached, Dynamo 1.6.1 retries there for about 120 s, logging only a
warning per attempt, and the process serves nothing meanwhile (spec dynamo_runtime.md §5, §8).
So the bridge first opens a TCP connection to each service it needs, with a short timeout, and
stops with one line naming the variable and the address when none answers; then it logs in as
Dynamo will (credentials.py: ETCD_AUTH_*, NATS_AUTH_*, NATS_TLS_*), for the same reason.

Before those, the addresses the process advertises (`check_advertised`): with etcd or
kubernetes discovery other hosts send it requests (DYN_TCP_RPC_HOST) and responses
(DYN_TCP_RESPONSE_STREAM_HOST) where it says; Dynamo accepts an unset, loopback or foreign one
without a word, and the process then reports READY while nothing reaches it. The rules are in
`check_advertised`'s doc and docs/deployment.md ("Several hosts").
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
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
RPC_HOST = "DYN_TCP_RPC_HOST"
RESPONSE_STREAM_HOST = "DYN_TCP_RESPONSE_STREAM_HOST"
_REQUEST_PLANE_HOSTS = (RPC_HOST, RESPONSE_STREAM_HOST)


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


def advertised_variables(request_plane: str, role: str) -> tuple[str, ...]:
    """The variables naming where other hosts reach this process. DYN_TCP_RPC_HOST: where a
    process that serves endpoints (worker, all) takes requests, on the tcp request plane only
    (on nats they arrive through NATS). DYN_TCP_RESPONSE_STREAM_HOST, on either plane (Dynamo
    sends every response back over TCP): where a process that calls other processes takes the
    answers, which every role does: a frontend's requests, and a worker's BLS calls, ensemble
    steps and control ops to other workers (the issue's worker without it failed a BLS call
    after 10 s as "Model 'preprocess' is not ready")."""
    if role == "frontend" or request_plane != "tcp":
        return (RESPONSE_STREAM_HOST,)
    return (RPC_HOST, RESPONSE_STREAM_HOST)


def place_request_plane(
    discovery: str, request_plane: str, role: str, environ: MutableMapping[str, str]
) -> None:
    """Where the TCP request plane listens. Unset, Dynamo binds an interface of its choosing.

    `mem` and `file` discovery are one host: pin to loopback unless the user chose otherwise.
    With etcd or kubernetes the addresses are the user's to give (check_advertised); a process
    that serves endpoints and names its request plane's address takes its response streams on
    the same address unless told otherwise: it is an address of this host the others reach.
    """
    if discovery in ("mem", "file"):
        for variable in _REQUEST_PLANE_HOSTS:
            environ.setdefault(variable, "127.0.0.1")
        return
    rpc_host = environ.get(RPC_HOST, "").strip()
    if role != "frontend" and rpc_host and not environ.get(RESPONSE_STREAM_HOST, "").strip():
        environ[RESPONSE_STREAM_HOST] = rpc_host
        log.info("%s unset: response streams on %s (%s)", RESPONSE_STREAM_HOST, rpc_host, RPC_HOST)


def _bare(host: str) -> str:
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _resolved(host: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The addresses `host` (an address or a name) stands for; OSError when it resolves to none."""
    try:
        return [ipaddress.ip_address(_bare(host))]
    except ValueError:
        pass
    found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in found]


def _all_loopback(hosts: list[str]) -> bool:
    try:
        return bool(hosts) and all(a.is_loopback for h in hosts for a in _resolved(h))
    except OSError:  # a name that does not resolve here is not this host's loopback
        return False


def _address_problem(value: str, one_host: bool) -> str | None:
    """What keeps the other hosts from reaching this process at `value` (what it "is"), or
    None."""
    if not value:
        if one_host:
            return None  # every process is on this host: whatever Dynamo picks is reachable
        return "not set (Dynamo would advertise an interface of its own choosing)"
    try:
        addresses = _resolved(value)
    except OSError as exc:
        return f"a name that does not resolve ({exc.strerror or exc})"
    if any(a.is_unspecified for a in addresses):
        # Measured: Dynamo binds every interface and advertises the one it picks itself.
        return "every interface (Dynamo would advertise one of its own choosing)"
    if not one_host and all(a.is_loopback for a in addresses):
        return "a loopback address"
    error = ""
    for address in addresses:
        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((str(address), 0))
                return None
            except OSError as exc:
                error = exc.strerror or str(exc)
    return f"not an address of this host (cannot bind it: {error})"


def check_advertised(
    discovery: str,
    request_plane: str,
    role: str,
    environ: Mapping[str, str],
    services: list[Service],
) -> None:
    """Raise RuntimeSettingsError, naming every variable at fault, unless the other hosts can
    reach this process where it advertises itself (after place_request_plane).

    `mem` and `file` discovery are one host (pinned to loopback). With etcd, one host too when
    every service it talks to (etcd, and NATS when used) is on loopback: nobody elsewhere can
    find this process, so loopback is right and Dynamo's own pick works. Otherwise, and always
    with kubernetes, each address must be set, not loopback nor every interface, and one this
    host can bind. Dynamo alone starts anyway: with an unset or wrong address it advertised one
    the cluster could not reach (every request to it failed while it reported READY, issue 39),
    or on nats left the client waiting 90 s for a response that never came; with an address
    not of this host it failed only when the first endpoint was served, after the models
    loaded ("Cannot assign requested address")."""
    if discovery in ("mem", "file"):
        return
    hosts = [host for service in services for host, _ in service.addresses]
    one_host = discovery == "etcd" and _all_loopback(hosts)
    variables = advertised_variables(request_plane, role)
    problems: dict[str, list[str]] = {}  # what is wrong → the variables it is wrong with
    for variable in variables:
        value = environ.get(variable, "").strip()
        problem = _address_problem(value, one_host)
        if problem is not None:
            problems.setdefault(problem, []).append(f"{variable}={value}" if value else variable)
    if not problems:
        return
    said = "; ".join(
        f"{' and '.join(names)} {'are' if len(names) > 1 else 'is'} {problem}"
        for problem, names in problems.items()
    )
    reached = ", ".join(f"{s.variable}={s.value}" for s in services) or f"{discovery} discovery"
    raise RuntimeSettingsError(
        f"{said}: with {reached} other hosts must reach this process at "
        f"{' and '.join(variables)}; set {'each' if len(variables) > 1 else 'it'} to an "
        "address of this host that they reach (docs/deployment.md, Several hosts)"
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


async def check_services(discovery: str, request_plane: str, role: str) -> None:
    """Before anything slow (loading models): the settings the runtime reads are valid, the
    addresses this process advertises can be reached (check_advertised), the services it will
    need answer, and take this process's credentials (credentials.py)."""
    check_system_port(os.environ)
    services = needed_services(discovery, request_plane, os.environ)
    place_request_plane(discovery, request_plane, role, os.environ)
    check_advertised(discovery, request_plane, role, os.environ, services)
    await check_reachable(services)
    try:
        await check_credentials(services, os.environ, CONNECT_TIMEOUT_S)
    except CredentialsError as exc:
        raise RuntimeSettingsError(str(exc)) from None


def start_runtime(discovery: str, request_plane: str, role: str) -> DistributedRuntime:
    """Dynamo's runtime on the running loop, its request plane placed (check_services checked
    it first; placing again is a no-op then)."""
    place_request_plane(discovery, request_plane, role, os.environ)
    return DistributedRuntime(asyncio.get_running_loop(), discovery, request_plane)
