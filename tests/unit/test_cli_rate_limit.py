"""`--rate-limit` and `--rate-limit-resource` read as tritonserver reads them, with their
DYN_BRIDGE_* forms (bridge/cli.py)."""

from __future__ import annotations

import pytest

from bridge.cli import build_parser, parse_with_environment
from model_repository_loader.scheduling.rate_limiter import ResourceLimit


def parse(argv: list[str], environ: dict[str, str] | None = None):
    return parse_with_environment(build_parser(), argv, environ or {})


def test_off_by_default_as_in_triton():
    args = parse([])
    assert args.rate_limit == "off"
    assert args.rate_limit_resources == []


def test_flags_and_their_case():
    args = parse(
        [
            "--rate-limit=EXECUTION_COUNT",
            "--rate-limit-resource=R1:10",
            "--rate-limit-resource=R2:5:1",
        ]
    )
    assert args.rate_limit == "execution_count"  # tritonserver lowers the mode
    assert args.rate_limit_resources == [ResourceLimit("R1", 10), ResourceLimit("R2", 5, 1)]


def test_environment_forms():
    args = parse(
        [],
        {"DYN_BRIDGE_RATE_LIMIT": "execution_count", "DYN_BRIDGE_RATE_LIMIT_RESOURCE": "A:1,B:2:0"},
    )
    assert args.rate_limit == "execution_count"
    assert args.rate_limit_resources == [ResourceLimit("A", 1), ResourceLimit("B", 2, 0)]


@pytest.mark.parametrize("argv", [["--rate-limit=sometimes"], ["--rate-limit-resource=R"]])
def test_bad_values_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        parse(argv)
    assert exited.value.code == 2
    if "--rate-limit-resource=R" in argv:
        assert "--rate-limit-resource option format is" in capsys.readouterr().err
