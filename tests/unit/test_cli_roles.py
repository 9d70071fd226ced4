"""--role, --discovery-backend, --request-plane, --namespace: defaults from Dynamo's environment
variables, and the combinations refused before anything starts (docs/deployment.md)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from bridge.cli import Topology, build_parser, resolve_topology
from bridge.roles.runtime import (
    RuntimeSettingsError,
    check_advertised,
    check_reachable,
    check_system_port,
    needed_services,
    place_request_plane,
)
from tests.harness.ports import free_port


def topology(*argv: str, **environ: str) -> Topology:
    parser = build_parser()
    return resolve_topology(parser, parser.parse_args(list(argv)), environ)


def refused(capsys: pytest.CaptureFixture[str], *argv: str, **environ: str) -> str:
    """The one-line error argparse prints (status 2), for a command line that must not run."""
    with pytest.raises(SystemExit) as exit_info:
        topology(*argv, **environ)
    assert exit_info.value.code == 2
    return capsys.readouterr().err.splitlines()[-1]


REPO = ("--model-repository", "models")


def test_defaults_are_the_embedded_default() -> None:
    assert topology(*REPO) == Topology("all", "mem", "tcp", "dynamo_bridge")


@pytest.mark.parametrize("role", ["worker", "frontend"])
def test_split_roles_default_to_file_discovery(role: str) -> None:
    argv = ("--role", role) + (REPO if role == "worker" else ())
    assert topology(*argv) == Topology(role, "file", "tcp", "dynamo_bridge")


def test_environment_gives_the_defaults() -> None:
    got = topology(
        DYN_BRIDGE_ROLE="frontend",
        DYN_DISCOVERY_BACKEND="etcd",
        DYN_REQUEST_PLANE="nats",
        DYN_NAMESPACE="team-a",
    )
    assert got == Topology("frontend", "etcd", "nats", "team-a")


def test_flags_win_over_the_environment() -> None:
    got = topology(
        *REPO,
        "--role=worker",
        "--discovery-backend=file",
        "--request-plane=tcp",
        "--namespace=mine",
        DYN_BRIDGE_ROLE="frontend",
        DYN_DISCOVERY_BACKEND="etcd",
        DYN_REQUEST_PLANE="nats",
        DYN_NAMESPACE="theirs",
    )
    assert got == Topology("worker", "file", "tcp", "mine")


def test_empty_environment_variables_are_unset() -> None:
    assert topology(*REPO, DYN_DISCOVERY_BACKEND="", DYN_NAMESPACE="") == Topology(
        "all", "mem", "tcp", "dynamo_bridge"
    )


def test_frontend_takes_no_repository(capsys) -> None:
    line = refused(capsys, "--role=frontend", *REPO)
    assert "--role frontend" in line and "--model-repository" in line


def test_worker_needs_a_repository(capsys) -> None:
    line = refused(capsys, "--role=worker")
    assert "required: --model-repository" in line


def test_all_needs_a_repository(capsys) -> None:
    assert refused(capsys).endswith("the following arguments are required: --model-repository")


@pytest.mark.parametrize("role", ["worker", "frontend"])
def test_mem_discovery_with_a_split_role_is_refused(capsys, role: str) -> None:
    argv = ("--role", role, "--discovery-backend=mem") + (REPO if role == "worker" else ())
    line = refused(capsys, *argv)
    assert f"--role {role}" in line and "mem discovery" in line


def test_mem_from_the_environment_with_a_split_role_is_refused(capsys) -> None:
    line = refused(capsys, "--role=worker", *REPO, DYN_DISCOVERY_BACKEND="mem")
    assert "mem discovery" in line


@pytest.mark.parametrize(
    ("argv", "environ", "named"),
    [
        (("--role=both",), {}, "--role"),
        (("--discovery-backend=zookeeper",), {}, "--discovery-backend"),
        (("--request-plane=http",), {}, "--request-plane"),
        ((), {"DYN_BRIDGE_ROLE": "leader"}, "DYN_BRIDGE_ROLE"),
        ((), {"DYN_REQUEST_PLANE": "udp"}, "DYN_REQUEST_PLANE"),
    ],
)
def test_unknown_values_are_refused(capsys, argv, environ, named) -> None:
    line = refused(capsys, *REPO, *argv, **environ)
    assert named in line and "invalid choice" in line


def test_namespace_must_be_a_dynamo_name(capsys) -> None:
    assert "--namespace" in refused(capsys, *REPO, "--namespace=Team A")


def test_choice_is_case_insensitive() -> None:
    assert topology(*REPO, "--role=Worker", "--discovery-backend=ETCD").role == "worker"


# -- what the runtime needs -------------------------------------------------------------------


def test_services_needed() -> None:
    assert needed_services("mem", "tcp", {}) == []
    assert needed_services("file", "tcp", {}) == []
    (etcd,) = needed_services("etcd", "tcp", {})
    assert (etcd.variable, etcd.value, etcd.defaulted) == (
        "ETCD_ENDPOINTS",
        "http://localhost:2379",
        True,
    )
    (nats,) = needed_services("file", "nats", {})
    assert (nats.variable, nats.addresses) == ("NATS_SERVER", (("localhost", 4222),))


def test_nats_server_set_is_needed_whatever_the_plane() -> None:
    # Dynamo connects to NATS_SERVER whenever it is set (measured with mem, file and etcd).
    (nats,) = needed_services("mem", "tcp", {"NATS_SERVER": "nats://10.0.0.5:4333"})
    assert nats.addresses == (("10.0.0.5", 4333),) and not nats.defaulted


def test_several_etcd_endpoints() -> None:
    (etcd,) = needed_services("etcd", "tcp", {"ETCD_ENDPOINTS": "http://a:1,http://b,c:3"})
    assert etcd.addresses == (("a", 1), ("b", 2379), ("c", 3))


def test_unreachable_service_names_variable_and_address() -> None:
    port = free_port()  # nothing listens there
    environ = {"ETCD_ENDPOINTS": f"http://127.0.0.1:{port}"}
    with pytest.raises(RuntimeSettingsError) as error:
        asyncio.run(check_reachable(needed_services("etcd", "tcp", environ), timeout=2.0))
    assert str(error.value).startswith(
        f"cannot reach etcd at http://127.0.0.1:{port} (ETCD_ENDPOINTS)"
    )


def test_reachable_service_passes() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        environ = {"ETCD_ENDPOINTS": f"http://127.0.0.1:{free_port()},http://127.0.0.1:{port}"}
        asyncio.run(check_reachable(needed_services("etcd", "tcp", environ), timeout=2.0))


@pytest.mark.parametrize("value", ["32768", "65000", "-1", "port"])
def test_system_port_out_of_dynamo_range(value: str) -> None:
    with pytest.raises(RuntimeSettingsError, match="DYN_SYSTEM_PORT"):
        check_system_port({"DYN_SYSTEM_PORT": value})


@pytest.mark.parametrize("value", ["0", "9090", "32767"])
def test_system_port_in_range(value: str) -> None:
    check_system_port({"DYN_SYSTEM_PORT": value})


@pytest.mark.parametrize("discovery", ["mem", "file"])
def test_one_host_pins_the_request_plane_to_loopback(discovery: str) -> None:
    environ: dict[str, str] = {"DYN_TCP_RPC_HOST": "10.1.2.3"}
    place_request_plane(discovery, "tcp", "worker", environ)
    assert environ == {"DYN_TCP_RPC_HOST": "10.1.2.3", "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1"}


# -- the addresses a process advertises (check_advertised) ------------------------------------

REMOTE_ETCD = {"ETCD_ENDPOINTS": "http://10.213.250.1:2379"}
LOCAL_ETCD = {"ETCD_ENDPOINTS": "http://127.0.0.1:2379"}
NOT_THIS_HOST = "198.51.100.7"  # TEST-NET-2: never an address of a test machine


def this_host_address() -> str | None:
    """A non-loopback address of this machine, if it has one."""
    for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
        address = str(info[4][0])
        if not address.startswith("127."):
            return address
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("198.51.100.1", 9))  # no packet is sent: the route's source address
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def advertised(
    role: str, environ: dict[str, str], discovery: str = "etcd", plane: str = "tcp"
) -> dict[str, str]:
    """place_request_plane then check_advertised, as check_services runs them; the environment
    after."""
    services = needed_services(discovery, plane, environ)
    place_request_plane(discovery, plane, role, environ)
    check_advertised(discovery, plane, role, environ, services)
    return environ


@pytest.mark.parametrize(
    ("role", "plane", "variables"),
    [
        ("worker", "tcp", ["DYN_TCP_RPC_HOST", "DYN_TCP_RESPONSE_STREAM_HOST"]),
        ("all", "tcp", ["DYN_TCP_RPC_HOST", "DYN_TCP_RESPONSE_STREAM_HOST"]),
        ("frontend", "tcp", ["DYN_TCP_RESPONSE_STREAM_HOST"]),
        # On nats responses still come back over TCP (the 90 s silent hang); a worker
        # needs it for BLS calls and ensemble steps to other workers.
        ("frontend", "nats", ["DYN_TCP_RESPONSE_STREAM_HOST"]),
        ("worker", "nats", ["DYN_TCP_RESPONSE_STREAM_HOST"]),
    ],
)
def test_several_hosts_refuse_an_unset_address(role, plane, variables) -> None:
    with pytest.raises(RuntimeSettingsError) as refused_info:
        advertised(role, dict(REMOTE_ETCD), plane=plane)
    text = str(refused_info.value)
    assert "\n" not in text
    names = " and ".join(variables)
    assert text.startswith(f"{names} {'are' if len(variables) > 1 else 'is'} not set"), text
    if plane == "nats":
        assert "DYN_TCP_RPC_HOST" not in text  # requests arrive through NATS
    assert "ETCD_ENDPOINTS=http://10.213.250.1:2379" in text


@pytest.mark.parametrize("value", ["127.0.0.1", "localhost", "::1"])
def test_several_hosts_refuse_loopback(value: str) -> None:
    with pytest.raises(
        RuntimeSettingsError, match=f"DYN_TCP_RESPONSE_STREAM_HOST={value} is a loopback"
    ):
        advertised("frontend", {**REMOTE_ETCD, "DYN_TCP_RESPONSE_STREAM_HOST": value})


def test_kubernetes_is_always_several_hosts() -> None:
    with pytest.raises(RuntimeSettingsError, match="is a loopback address"):
        advertised(
            "frontend", {"DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1"}, discovery="kubernetes"
        )


def test_an_address_of_another_host_is_refused() -> None:
    environ = {**REMOTE_ETCD, "DYN_TCP_RESPONSE_STREAM_HOST": NOT_THIS_HOST}
    with pytest.raises(RuntimeSettingsError, match="is not an address of this host"):
        advertised("frontend", environ)


def test_every_interface_is_refused() -> None:
    # Measured: with 0.0.0.0 Dynamo advertises an interface of its own choosing.
    environ = {**REMOTE_ETCD, "DYN_TCP_RESPONSE_STREAM_HOST": "0.0.0.0"}
    with pytest.raises(RuntimeSettingsError, match="=0.0.0.0 is every interface"):
        advertised("frontend", environ)


def test_an_unresolvable_name_is_refused() -> None:
    environ = {**REMOTE_ETCD, "DYN_TCP_RESPONSE_STREAM_HOST": "no-such-host.invalid"}
    with pytest.raises(RuntimeSettingsError, match="is a name that does not resolve"):
        advertised("frontend", environ)


@pytest.mark.parametrize("role", ["worker", "frontend", "all"])
def test_one_host_with_etcd_on_loopback_takes_loopback_or_nothing(role: str) -> None:
    pinned = {**LOCAL_ETCD, "DYN_TCP_RPC_HOST": "127.0.0.1", "DYN_TCP_RESPONSE_STREAM_HOST": "::1"}
    assert advertised(role, dict(pinned)) == pinned
    assert advertised(role, dict(LOCAL_ETCD)) == LOCAL_ETCD  # Dynamo's pick is this host's
    # With NATS elsewhere, other hosts share the request plane: not one host any more.
    nats = {**LOCAL_ETCD, "NATS_SERVER": "nats://10.213.250.1:4222"}
    with pytest.raises(RuntimeSettingsError, match="NATS_SERVER=nats://10.213.250.1:4222"):
        advertised(role, {**nats, "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1"}, plane="nats")


def test_a_worker_takes_responses_on_its_request_plane_address() -> None:
    address = this_host_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    environ = advertised("worker", {**REMOTE_ETCD, "DYN_TCP_RPC_HOST": address})
    assert environ["DYN_TCP_RESPONSE_STREAM_HOST"] == address
    # Given, its own value is kept (and checked).
    given = {
        **REMOTE_ETCD,
        "DYN_TCP_RPC_HOST": address,
        "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
    }
    with pytest.raises(RuntimeSettingsError) as refused_info:
        advertised("worker", given)
    assert str(refused_info.value).startswith(
        "DYN_TCP_RESPONSE_STREAM_HOST=127.0.0.1 is a loopback"
    )
    # A frontend does not borrow a worker's variable.
    with pytest.raises(RuntimeSettingsError, match="DYN_TCP_RESPONSE_STREAM_HOST is not set"):
        advertised("frontend", {**REMOTE_ETCD, "DYN_TCP_RPC_HOST": address})
