"""Dynamic batching, queue policy, instance groups and batch stacking through the bridge.

Expected groupings and texts are what real Triton 2.51 did with the same models and timings
(tests/differential/test_diff_batching.py checks them side by side; tests/repositories/batching).
"""

from __future__ import annotations

import pytest

from tests.differential.support import Failure, expected_bridge_error
from tests.e2e.scheduling_support import Send, errors, groups, run_scenario


@pytest.fixture(scope="module")
def url(shared_bridge_server, repository) -> str:
    return shared_bridge_server(repository("batching")).grpc_url  # one model.py, many configs


def _bridge_error(status: str, text: str) -> tuple[str, str]:
    failure = expected_bridge_error(Failure(status, text))
    return failure.status, failure.message


def test_requests_within_the_delay_share_one_call(url: str):
    sends = [Send(0.0, "a"), Send(0.02, "b", 2), Send(0.04, "c", 3)]
    outcomes = run_scenario(url, "dyn_delay", sends)
    assert groups(outcomes) == [["a", "b", "c"]]
    assert sorted(outcomes["c"].report["sizes"]) == [1, 2, 3]


def test_max_batch_size_closes_a_batch_and_never_splits_a_request(url: str):
    sends = [Send(0.0, "w"), Send(0.05, "a"), Send(0.1, "b", 6), Send(0.35, "c", 2)]
    assert groups(run_scenario(url, "dyn_delay", sends)) == [["a", "b", "w"], ["c"]]


def test_preferred_sizes(url: str):
    spaced = [Send(0.3 * i, f"s{i}") for i in range(3)]
    assert groups(run_scenario(url, "dyn_preferred", spaced)) == [["s0", "s1"], ["s2"]]
    large = [Send(0.0, "blk", sleep_ms=400), Send(0.25, "a", 6), Send(0.5, "b"), Send(0.55, "c")]
    assert groups(run_scenario(url, "dyn_preferred", large)) == [["blk"], ["a"], ["b", "c"]]


def test_no_batching_without_a_batch_dimension(url: str):
    sends = [Send(0.0, f"r{i}") for i in range(4)]
    outcomes = run_scenario(url, "dyn_unbatched", sends, batching=False)
    assert sorted(groups(outcomes)) == [["r0"], ["r1"], ["r2"], ["r3"]]


def test_priority_levels(url: str):
    sends = [
        Send(0.0, "blk", sleep_ms=1200),
        Send(0.2, "a"),
        Send(0.4, "b"),
        Send(0.6, "c", options={"priority": 1}),
        Send(0.8, "e", options={"priority": 9}),
    ]
    assert groups(run_scenario(url, "priorities", sends)) == [["blk"], ["c"], ["a"], ["b"], ["e"]]


def test_queue_full(url: str):
    sends = [Send(0.0, "blk", sleep_ms=1200)] + [Send(0.2 * (i + 1), f"r{i}") for i in range(3)]
    outcomes = run_scenario(url, "queue_full", sends)
    assert errors(outcomes) == {
        "r2": _bridge_error("StatusCode.UNAVAILABLE", "[request id: r2] Exceeds maximum queue size")
    }


def test_queue_timeout(url: str):
    sends = [
        Send(0.0, "blk", sleep_ms=1000),
        Send(0.25, "r0"),
        Send(0.28, "long", options={"timeout": 2_000_000}),
    ]
    outcomes = run_scenario(url, "queue_timeout", sends)
    expired = _bridge_error("StatusCode.UNAVAILABLE", "Request timeout expired")
    assert errors(outcomes) == {"r0": expired, "long": expired}


def test_delay_action_runs_expired_requests_last(url: str):
    # Timeout 1.5 s: r0, r1 expire by 1.95 s; "late" (2.2 s) is in time when blk ends at 2.7 s.
    sends = [Send(0.0, "blk", sleep_ms=2700), Send(0.25, "r0"), Send(0.45, "r1"), Send(2.2, "late")]
    outcomes = run_scenario(url, "queue_delay_action", sends)
    assert groups(outcomes) == [["blk"], ["late"], ["r0"], ["r1"]]


def test_instance_group_kinds(url: str):
    sends = [Send(0.0, f"g{i}", sleep_ms=500) for i in range(4)]
    outcomes = run_scenario(url, "groups", sends, batching=False)
    assert {
        (o.report["instance"], o.report["kind"], o.report["device"]) for o in outcomes.values()
    } == {
        ("groups_0_0", "CPU", "0"),
        ("groups_0_1", "CPU", "0"),
        ("groups_1_0", "MODEL", "0"),
        ("groups_2_0", "CPU", "0"),
    }


def test_stacked_batch(url: str):
    """bridge_stack_batch: execute sees one request of 6 rows; each client gets its rows."""
    sends = [Send(0.0, "a", 1, value=1), Send(0.25, "b", 2, value=2), Send(0.3, "c", 3, value=3)]
    outcomes = run_scenario(url, "stacked", sends)
    assert groups(outcomes) == [["a"]]
    assert outcomes["a"].report["sizes"] == [6]
    assert {rid: o.out for rid, o in outcomes.items()} == {"a": [1], "b": [2, 2], "c": [3, 3, 3]}
