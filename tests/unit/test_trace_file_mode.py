"""Triton's trace file is readable by the server's user alone (issue 38, finding 7): it holds
request ids and, at level TENSORS, the inputs themselves (bridge/tracing/triton_file.py)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.tracing.triton_file import TraceFile


@pytest.fixture(params=[0o022, 0o000], ids=["umask-022", "umask-000"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    before = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(before)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_trace_file_is_made_0600(tmp_path: Path, umask: int) -> None:
    path = tmp_path / "trace.json"
    trace = TraceFile(str(path))
    trace.save(['{"id":1}'], to_index_file=False)
    assert _mode(path) == 0o600
    trace.save(['{"id":2}'], to_index_file=False)
    trace.close()
    assert json.loads(path.read_text()) == [{"id": 1}, {"id": 2}]
    assert _mode(path) == 0o600


def test_each_indexed_trace_file_is_made_0600(tmp_path: Path, umask: int) -> None:
    path = tmp_path / "trace.json"
    trace = TraceFile(str(path))
    trace.save(['{"id":1}'], to_index_file=True)
    trace.save(['{"id":2}'], to_index_file=True)
    for index, expected in ((0, 1), (1, 2)):
        written = Path(f"{path}.{index}")
        assert _mode(written) == 0o600
        assert json.loads(written.read_text()) == [{"id": expected}]


def test_an_existing_world_readable_trace_file_is_made_0600_before_it_is_written(
    tmp_path: Path, umask: int
) -> None:
    path = tmp_path / "trace.json"
    path.write_text("left by an earlier run")
    path.chmod(0o644)
    trace = TraceFile(str(path))
    trace.save(['{"id":1}'], to_index_file=False)
    trace.close()
    assert _mode(path) == 0o600
    assert json.loads(path.read_text()) == [{"id": 1}]
