"""Every flag has a DYN_BRIDGE_* environment form (bridge/cli.py): the command line wins, then
the environment, then the default; invalid values are refused naming the variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.cli import build_parser, env_name, parse_with_environment


def parse(argv: list[str], environ: dict[str, str]):
    return parse_with_environment(build_parser(), argv, environ)


def test_every_flag_but_the_topology_ones_has_a_variable():
    parser = build_parser()
    names = {env_name(a) for a in parser._actions if a.option_strings and a.dest != "help"}
    assert "DYN_BRIDGE_GRPC_PORT" in names
    assert "DYN_BRIDGE_MODEL_REPOSITORY" in names
    assert "DYN_BRIDGE_EXIT_TIMEOUT_SECS" in names


def test_the_environment_fills_what_the_command_line_leaves():
    args = parse(
        [],
        {
            "DYN_BRIDGE_GRPC_PORT": "9101",
            "DYN_BRIDGE_EXIT_TIMEOUT_SECS": "7.5",
            "DYN_BRIDGE_STRICT_MODEL_CONFIG": "true",
            "DYN_BRIDGE_MODEL_CONTROL_MODE": "explicit",
        },
    )
    assert args.grpc_port == 9101
    assert args.exit_timeout_secs == 7.5
    assert args.strict_model_config is True
    assert args.model_control_mode == "explicit"


def test_the_command_line_wins_over_the_environment():
    environ = {"DYN_BRIDGE_GRPC_PORT": "9101", "DYN_BRIDGE_MODEL_REPOSITORY": "/env/a"}
    args = parse(["--grpc-port", "9202", "--model-repository", "/cli"], environ)
    assert args.grpc_port == 9202
    assert args.model_repositories == [Path("/cli")]  # replaced, not extended


def test_a_repeatable_flag_takes_a_list():
    args = parse([], {"DYN_BRIDGE_MODEL_REPOSITORY": "/a:/b", "DYN_BRIDGE_LOAD_MODEL": "x, y"})
    assert args.model_repositories == [Path("/a"), Path("/b")]
    assert args.load_models == ["x", "y"]


@pytest.mark.parametrize(
    ("name", "value"),
    [("DYN_BRIDGE_GRPC_PORT", "eighty"), ("DYN_BRIDGE_MODEL_CONTROL_MODE", "sometimes")],
)
def test_an_invalid_variable_is_refused_by_name(name, value, capsys):
    with pytest.raises(SystemExit) as exited:
        parse([], {name: value})
    assert exited.value.code == 2
    assert name in capsys.readouterr().err


def test_the_servers_waits_are_settings_with_an_environment_form():
    from bridge.options import Timings

    assert Timings.from_environment({}) == Timings()
    timings = Timings.from_environment(
        {"DYN_BRIDGE_ROUTE_QUIET_SECS": "2", "DYN_BRIDGE_CLOSE_TIMEOUT_SECS": "0.5"}
    )
    assert timings.route_quiet_secs == 2.0 and timings.close_timeout_secs == 0.5
    assert timings.drain_timeout_secs == Timings().drain_timeout_secs
    with pytest.raises(ValueError, match="DYN_BRIDGE_DRAIN_TIMEOUT_SECS"):
        Timings.from_environment({"DYN_BRIDGE_DRAIN_TIMEOUT_SECS": "-1"})


def test_dynamo_runtime_threads_are_raised_unless_the_user_chose() -> None:
    from bridge.tuning import runtime_threads

    environ: dict[str, str] = {}
    assert runtime_threads(environ, cpus=2) == {"DYN_RUNTIME_MAX_BLOCKING_THREADS": "16"}
    assert environ == {"DYN_RUNTIME_MAX_BLOCKING_THREADS": "16"}
    assert runtime_threads({}, cpus=8) == {"DYN_RUNTIME_MAX_BLOCKING_THREADS": "32"}
    # nats: the worker threads too (an endpoint() call can wedge below that bound)
    assert runtime_threads({}, "nats", cpus=2) == {
        "DYN_RUNTIME_MAX_BLOCKING_THREADS": "16",
        "DYN_RUNTIME_NUM_WORKER_THREADS": "64",
    }
    assert runtime_threads({}, "nats", cpus=128)["DYN_RUNTIME_NUM_WORKER_THREADS"] == "128"
    for chosen in ("DYN_RUNTIME_MAX_BLOCKING_THREADS", "DYN_RUNTIME_NUM_WORKER_THREADS"):
        environ = {chosen: "3"}
        assert runtime_threads(environ, "nats", cpus=2) == {}
        assert environ == {chosen: "3"}


def test_the_environment_limits_are_flags_with_variables():
    from model_repository_loader.isolation.environments import EnvironmentLimits

    defaults = parse([], {})
    assert (
        defaults.environment_max_bytes,
        defaults.environment_max_files,
        defaults.environment_cache_max_bytes,
    ) == (
        EnvironmentLimits().max_bytes,
        EnvironmentLimits().max_files,
        EnvironmentLimits().cache_bytes,
    )
    args = parse(
        ["--environment-max-files", "1000"],
        {
            "DYN_BRIDGE_ENVIRONMENT_MAX_BYTES": "1048576",
            "DYN_BRIDGE_ENVIRONMENT_MAX_FILES": "5",
            "DYN_BRIDGE_ENVIRONMENT_CACHE_MAX_BYTES": "2097152",
        },
    )
    assert (args.environment_max_bytes, args.environment_max_files) == (1 << 20, 1000)
    assert args.environment_cache_max_bytes == 2 << 20


def test_grpc_server_io_is_chosen_unless_the_user_did_or_grpcio_may_not_know_it() -> None:
    from bridge.tuning import GRPC_LISTENER_OFF, grpc_server_io

    environ: dict[str, str] = {}
    with grpc_server_io(environ, "1.85.3") as chosen:
        assert chosen == GRPC_LISTENER_OFF
        assert environ == {"GRPC_EXPERIMENTS": "-event_engine_listener"}  # while grpc loads
    assert environ == {}  # then out again: processes started later do not inherit it
    with grpc_server_io({}, "1.60.0") as chosen:
        assert chosen == GRPC_LISTENER_OFF
    for unknown in ("1.59.3", "1.86.0", "2.0.0", None):  # not known to have the experiment
        with grpc_server_io(environ, unknown) as chosen:
            assert chosen is None and environ == {}
    environ = {"GRPC_EXPERIMENTS": ""}  # the user's, even empty: kept, and left in place
    with grpc_server_io(environ, "1.85.3") as chosen:
        assert chosen is None
    assert environ == {"GRPC_EXPERIMENTS": ""}


def test_the_entry_chooses_before_anything_loads_grpc() -> None:
    """gRPC's core reads GRPC_EXPERIMENTS once, when `import grpc` loads it: the entry module
    (and what it imports) must not load it first."""
    import subprocess
    import sys

    check = "import sys, bridge.entry; assert 'grpc' not in sys.modules, 'grpc loaded'"
    subprocess.run([sys.executable, "-c", check], check=True)
