"""--frontend and the triton door's flags (tritonserver's names): what main() refuses before
anything starts, and --grpc-restricted-protocol's parsing."""

from __future__ import annotations

import os

import pytest

from bridge.cli import (
    build_parser,
    parse_with_environment,
    resolve_door,
    resolve_max_shm_regions,
)
from bridge.frontends.triton.grpc.restrictions import parse_restricted_protocol
from bridge.frontends.triton.shm import DEFAULT_MAX_REGIONS
from bridge.restrictions import Restriction


@pytest.fixture(autouse=True)
def _no_frontend_in_the_environment(monkeypatch) -> None:
    # `--frontend`'s default comes from DYN_BRIDGE_FRONTEND (scripts/test.sh sets it).
    monkeypatch.delenv("DYN_BRIDGE_FRONTEND", raising=False)


def door(*argv: str):
    parser = build_parser()
    args = parse_with_environment(parser, ["--model-repository", "models", *argv], os.environ)
    return resolve_door(parser, args)


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        door(*argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err.splitlines()[-1]


def test_default_is_the_triton_door(monkeypatch) -> None:
    assert door() is not None
    options = door("--grpc-use-ssl", "--grpc-server-cert", "c")
    assert options.use_ssl and str(options.server_cert) == "c"
    assert door("--frontend", "dynamo") is None
    monkeypatch.setenv("DYN_BRIDGE_FRONTEND", "dynamo")
    assert door() is None


def test_tls_and_restrictions_need_the_triton_door(capsys) -> None:
    for flag in (
        "--grpc-use-ssl",
        "--grpc-use-ssl-mutual",
        "--grpc-restricted-protocol=health:k=v",
    ):
        assert refused(capsys, "--frontend", "dynamo", flag).endswith("need --frontend triton")


def test_grpc_max_message_size(capsys, monkeypatch) -> None:
    assert door("--frontend", "triton").max_message_size == 2**31 - 1  # Triton's, fixed there
    monkeypatch.setenv("DYN_BRIDGE_GRPC_MAX_MESSAGE_SIZE", "1048576")
    assert door("--frontend", "triton").max_message_size == 1 << 20
    assert refused(capsys, "--frontend", "dynamo").endswith(
        "--grpc-max-message-size needs --frontend triton"
    )
    monkeypatch.setenv("DYN_BRIDGE_GRPC_MAX_MESSAGE_SIZE", "0")
    assert "expected a whole number of 1 or more, got '0'" in refused(
        capsys, "--frontend", "triton"
    )


def test_bytes_limits_flags_and_their_environment_forms(monkeypatch) -> None:
    parser = build_parser()
    args = parse_with_environment(parser, ["--model-repository", "m"], os.environ)
    assert (args.max_bytes_elements, args.max_bytes_decoded_size) == (1 << 24, 1 << 30)
    monkeypatch.setenv("DYN_BRIDGE_MAX_BYTES_ELEMENTS", "5")
    args = parse_with_environment(
        parser, ["--model-repository", "m", "--max-bytes-decoded-size", "7"], os.environ
    )
    assert (args.max_bytes_elements, args.max_bytes_decoded_size) == (5, 7)


def test_frontend_from_the_environment_is_checked(capsys, monkeypatch) -> None:
    monkeypatch.setenv("DYN_BRIDGE_FRONTEND", "tritonn")
    assert refused(capsys).endswith(
        "DYN_BRIDGE_FRONTEND: invalid value 'tritonn': choose from triton, dynamo"
    )


def test_restricted_protocol_values() -> None:
    assert parse_restricted_protocol(["health,inference:k=v", "statistics:a=b=c"]) == {
        "health": Restriction("k", "v"),
        "inference": Restriction("k", "v"),
        "statistics": Restriction("a", "b=c"),
    }
    for bad, text in [
        ("inference", "option format is"),
        ("infer:k=v", "unknown restricted protocol 'infer'"),
    ]:
        with pytest.raises(ValueError, match=text):
            parse_restricted_protocol([bad])
    with pytest.raises(ValueError, match="can not be specified in multiple config groups"):
        parse_restricted_protocol(["health:k=v", "health:k=w"])


def test_max_shm_regions_defaults_to_the_door_s_cap_and_says_so(capsys) -> None:
    parser = build_parser()
    given = parse_with_environment(parser, ["--max-shm-regions", "7"], {})
    assert resolve_max_shm_regions(given) == 7
    default = parse_with_environment(parser, [], {})
    assert resolve_max_shm_regions(default) == DEFAULT_MAX_REGIONS
    # The help names the default without importing the door to build the parser.
    help_text = " ".join(parser.format_help().split())
    assert f"registered at once (default {DEFAULT_MAX_REGIONS})" in help_text
    with pytest.raises(SystemExit):
        parse_with_environment(parser, ["--max-shm-regions", "0"], {})
