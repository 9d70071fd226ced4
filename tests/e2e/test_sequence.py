"""Sequence batching through the bridge: routing, control inputs, errors, idle sequences.

Expected values are what real Triton 2.51 answered for the same models and requests
(tests/differential/test_diff_batching.py; tests/repositories/sequence/README.md).
"""

from __future__ import annotations

import time

import pytest

from tests.differential.support import Failure, expected_bridge_error
from tests.e2e.scheduling_support import Send, infer

STEPS = [  # request id, sequence id, start, end; sent one after another
    ("a1", 11, True, False),
    ("b1", 12, True, False),
    ("c1", 13, True, False),
    ("a2", 11, False, False),
    ("b2", 12, False, True),
    ("a3", 11, False, True),
    ("c2", 13, False, True),
]


@pytest.fixture(scope="module")
def client(shared_bridge_server, repository):
    return shared_bridge_server(repository("sequence")).client()  # its models share one model.py


def _run(client, model: str, batching: bool = True) -> dict:
    out = {}
    for rid, sid, start, end in STEPS:
        options = {"sequence_id": sid, "sequence_start": start, "sequence_end": end}
        out[rid] = infer(client, model, Send(0, rid, options=options), batching)
    return out


def _bridge_error(text: str) -> tuple[str, str]:
    failure = expected_bridge_error(Failure("StatusCode.INVALID_ARGUMENT", text))
    return failure.status, failure.message


@pytest.mark.parametrize("model", ["seq_direct", "seq_oldest"])
def test_each_sequence_stays_on_one_instance(client, model: str):
    outcomes = _run(client, model)
    assert all(o.ok for o in outcomes.values())
    # Sums are kept per instance, so they are right only if nothing moved or reordered.
    assert {rid: o.out for rid, o in outcomes.items()} == {
        "a1": [1],
        "b1": [1],
        "c1": [1],
        "a2": [2],
        "b2": [2],
        "a3": [3],
        "c2": [2],
    }
    where = {rid: o.report["instance"] for rid, o in outcomes.items()}
    assert where["a1"] == where["a2"] == where["a3"] != where["b1"] == where["b2"]
    assert where["c1"] == where["c2"]
    assert [outcomes[r].report["corrid"] for r in ("a1", "b2")] == [11, 12]
    assert [outcomes[r].report["flags"] for r in ("a1", "a2", "a3")] == [1, 0, 2]
    # Direct pads the empty slot 0 of b1's instance when c1 runs alone in slot 1 [V].
    expected_batch = 2 if model == "seq_direct" else 1
    assert outcomes["c1"].report["batch"] == expected_batch


def test_control_inputs(client):
    outcomes = _run(client, "seq_direct")
    assert outcomes["a1"].report["controls"] == {
        "START": [[1, 1], "int32", [1]],
        "END": [[1, 1], "float32", [0.0]],
        "READY": [[1, 1], "bool", [True]],
        "CORRID": [[1, 1], "uint64", [11]],
    }
    assert outcomes["a3"].report["controls"]["END"] == [[1, 1], "float32", [1.0]]
    assert outcomes["a3"].report["controls"]["START"] == [[1, 1], "int32", [0]]
    flat = _run(client, "seq_unbatched", batching=False)
    assert flat["a1"].report["controls"]["CORRID"] == [[1], "uint64", [11]]


def test_string_correlation_id(client):
    options = {"sequence_id": "abc", "sequence_start": True, "sequence_end": True}
    report = infer(client, "seq_direct", Send(0, "s", options=options)).report
    assert report["corrid"] == "abc" and report["flags"] == 3
    assert report["controls"]["CORRID"] == [[1, 1], "uint64", [0x63626100000003]]


@pytest.mark.parametrize(
    ("options", "rows", "text"),
    [
        (
            {},
            1,
            "inference request to model 'seq_direct' must specify a non-zero or non-empty "
            "correlation ID",
        ),
        (
            {"sequence_id": 99},
            1,
            "inference request for sequence 99 to model 'seq_direct' must specify the START flag "
            "on the first request of the sequence",
        ),
        (
            {"sequence_id": 98, "sequence_start": True},
            2,
            "inference request to model 'seq_direct' must specify batch-size 1 due to "
            "requirements of sequence batcher",
        ),
    ],
    ids=["no-correlation-id", "no-start", "batch-2"],
)
def test_invalid_sequence_requests(client, options: dict, rows: int, text: str):
    outcome = infer(client, "seq_direct", Send(0, "x", rows, options=options))
    assert (outcome.status, outcome.message) == _bridge_error(text)


def test_idle_sequence_released_and_backlog(client):
    """seq_idle: one slot, 300 ms idle limit. A new sequence waits in the backlog until the
    slot's sequence has been idle that long; by then the idle one is gone. No sleep: the
    backlogged request's answer is the event that the slot was released."""

    def start(tag: str, sequence_id: int):
        options = {"sequence_id": sequence_id, "sequence_start": True}
        return infer(client, "seq_idle", Send(0, tag, options=options), False)

    assert start("a1", 5).ok
    # The only slot is sequence 5's: sequence 6 runs once 5 has been idle 300 ms.
    assert start("b1", 6).ok
    late = infer(client, "seq_idle", Send(0, "a2", options={"sequence_id": 5}), False)
    assert (late.status, late.message) == _bridge_error(
        "inference request for sequence 5 to model 'seq_idle' must specify the START flag on "
        "the first request of the sequence"
    )
    # Sequence 7 waits until 6 has been idle 300 ms since b2 (tests/differential/
    # test_diff_batching.py says why b2).
    began = time.monotonic()
    assert infer(client, "seq_idle", Send(0, "b2", options={"sequence_id": 6}), False).ok
    assert start("c1", 7).ok
    assert time.monotonic() - began >= 0.25
