"""Server-level RPCs, and the list of known frontend differences itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.differential.support import (
    KNOWN_FRONTEND_DIFFERENCES,
    TRITON_DOOR,
    Failure,
    Pair,
    both,
)
from tests.differential.test_diff_load_failures import model_frames_only


@pytest.mark.oracle
@pytest.mark.parametrize(
    "rpc",
    [
        pytest.param(
            "get_server_metadata",
            marks=pytest.mark.skipif(TRITON_DOOR, reason="the triton door implements it"),
        ),
        pytest.param(
            "get_model_repository_index",
            marks=pytest.mark.skipif(TRITON_DOOR, reason="the triton door implements it"),
        ),
        pytest.param(
            "get_inference_statistics",
            marks=pytest.mark.skipif(TRITON_DOOR, reason="the triton door implements it"),
        ),
    ],
)
def test_rpcs_the_frontend_does_not_implement(examples: Pair, rpc: str):
    """Difference repository_index: Triton answers, the frontend says UNIMPLEMENTED."""
    triton, bridge = both(examples, lambda c: getattr(c, rpc)(as_json=True))
    assert isinstance(triton, dict) and triton, triton
    assert isinstance(bridge, Failure) and bridge.status == "StatusCode.UNIMPLEMENTED", bridge


@pytest.mark.oracle
def test_server_live_and_ready(examples: Pair):
    triton, bridge = both(examples, lambda c: (c.is_server_live(), c.is_server_ready()))
    assert triton == bridge == (True, True)


def test_every_known_difference_is_asserted_by_a_test():
    """Each entry of KNOWN_FRONTEND_DIFFERENCES is named in some differential test."""
    sources = "".join(p.read_text() for p in Path(__file__).parent.glob("test_diff_*.py"))
    unused = [name for name in KNOWN_FRONTEND_DIFFERENCES if name not in sources]
    assert unused == []


@pytest.mark.oracle
@pytest.mark.skipif(not TRITON_DOOR, reason="Dynamo's frontend: repository_index")
def test_server_metadata(examples: Pair):
    """The triton door names Triton's server and version, and only extensions it serves."""
    triton, bridge = both(examples, lambda c: c.get_server_metadata(as_json=True))
    assert (bridge["name"], bridge["version"]) == (triton["name"], triton["version"])
    assert set(bridge["extensions"]) <= set(triton["extensions"])


@pytest.mark.oracle
@pytest.mark.skipif(not TRITON_DOOR, reason="Dynamo's frontend: repository_index")
@pytest.mark.parametrize("fixture", ["examples", "load_failures"])
def test_repository_index(request, fixture: str):
    """Every model, ready or failed with Triton's reason, in Triton's order and states."""
    pair: Pair = request.getfixturevalue(fixture)
    triton, bridge = both(pair, lambda c: c.get_model_repository_index(as_json=True))

    def comparable(index: dict) -> list[dict]:
        # Traceback frames outside the models are implementation detail (test_diff_load_failures)
        return [
            {**row, "reason": model_frames_only(row["reason"], pair.root)}
            if "reason" in row
            else row
            for row in index["models"]
        ]

    assert comparable(bridge) == comparable(triton)


@pytest.mark.oracle
@pytest.mark.skipif(not TRITON_DOOR, reason="Dynamo's frontend: repository_index")
def test_statistics_fields(examples: Pair):
    """The same models and versions, with the same fields (the values are each server's own)."""
    triton, bridge = both(examples, lambda c: c.get_inference_statistics(as_json=True))

    def shape(stats: dict) -> list:
        return [
            (s["name"], s["version"], sorted(s["inference_stats"])) for s in stats["model_stats"]
        ]

    assert shape(bridge) == shape(triton)
