"""Server-level RPCs, and the list of known frontend differences itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.differential.support import KNOWN_FRONTEND_DIFFERENCES, Failure, Pair, both


@pytest.mark.oracle
@pytest.mark.parametrize(
    "rpc",
    ["get_server_metadata", "get_model_repository_index", "get_inference_statistics"],
)
def test_rpcs_the_frontend_does_not_implement(examples: Pair, rpc: str):
    """Difference repository_index: Triton answers, Dynamo's frontend says UNIMPLEMENTED."""
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
