"""Scheduling against real Triton: which requests share an execute call, queue policy errors,
instance groups, and sequence routing (tests/repositories/batching and sequence, see READMEs).

Where only order matters (priorities, the default scheduler, a full queue), one request holds
the instance at a gate and the others are sent one by one, each once the server shows the one
before in its queue (`run_held`): no clock. Where time is the behaviour (queue delays,
timeouts), each scenario sends timed requests (tests/e2e/scheduling_support.py) to the oracle and
to the bridge; the models report the request ids of the execute call that served them. Delays are
hundreds of milliseconds, so the grouping does not depend on the machine's speed: requests whose
order matters are at least 0.2 s apart (a loaded machine can deliver requests sent 20-40 ms apart
in either order), and every other timing (queue delays, timeouts, how long `blk` holds the
instance) leaves 0.4 s or more to spare.
"""

from __future__ import annotations

import time
import warnings

import pytest

from tests.differential.support import TRITON_DOOR, Failure, Pair, expected_bridge_error
from tests.e2e.scheduling_support import (
    Send,
    errors,
    groups,
    infer,
    run_held,
    run_scenario,
)

pytestmark = pytest.mark.oracle


@pytest.fixture(scope="module")
def batching(pair_for, repository) -> Pair:
    return pair_for(repository("batching"))  # its models share one model.py


@pytest.fixture(scope="module")
def sequence(pair_for, repository) -> Pair:
    return pair_for(repository("sequence"))  # its models share one model.py


def _both(pair: Pair, model: str, sends: list[Send], batching: bool = True) -> tuple[dict, dict]:
    triton = run_scenario(pair.oracle.grpc_url, model, sends, batching)
    bridge = run_scenario(pair.bridge.grpc_url, model, sends, batching)
    return triton, bridge


def _bridge_errors(triton: dict) -> dict:
    return {
        rid: tuple(vars(expected_bridge_error(Failure(*error))).values())
        for rid, error in errors(triton).items()
    }


BLOCK = 400  # ms the first request holds the only instance


def _calls(model: str, outcomes: dict) -> list[list[str]]:
    """The execute calls of a scenario, with what the scenario leaves open taken out."""
    calls = groups(outcomes)
    if model == "dyn_unbatched":
        # Sent at once, so they reach a server in any order: only the calls count.
        return sorted(calls)
    if model == "dyn_no_delay":
        # On a loaded machine Triton sometimes runs r4 and r5 one by one (3 in 20 runs under
        # CPU stalls, never on an idle one): only which requests come after the full batch counts.
        return calls[:2] + [sorted(sum(calls[2:], []))]
    return calls


@pytest.mark.parametrize(
    ("model", "sends", "expected"),
    [
        # Requests inside the queue delay share one call (sizes 1+2+3 <= 8).
        (
            "dyn_delay",
            [Send(0.0, "a"), Send(0.02, "b", 2), Send(0.04, "c", 3)],
            [["a", "b", "c"]],
        ),
        # The full max batch goes at once; the rest waits for the delay.
        (
            "dyn_delay",
            [Send(0.0, f"r{i}") for i in range(8)] + [Send(0.4, "r8"), Send(0.42, "r9")],
            [[f"r{i}" for i in range(8)], ["r8", "r9"]],
        ),
        # A request never splits: 'c' (2 rows) would pass max_batch_size 8, so it waits.
        (
            "dyn_delay",
            [Send(0.0, "w"), Send(0.05, "a"), Send(0.1, "b", 6), Send(0.35, "c", 2)],
            [["a", "b", "w"], ["c"]],
        ),
        # A preferred size (2) goes at once; a lone request waits for the delay.
        ("dyn_preferred", [Send(0.3 * i, f"s{i}") for i in range(3)], [["s0", "s1"], ["s2"]]),
        # A request at or above the largest preferred size (4) goes alone.
        (
            "dyn_preferred",
            [Send(0.0, "blk", sleep_ms=BLOCK), Send(0.25, "a", 6), Send(0.5, "b"), Send(0.55, "c")],
            [["blk"], ["a"], ["b", "c"]],
        ),
        # While the instance is busy the next batch forms ahead and grows to the largest
        # preferred size; then one more request still fits (Triton's payload growth).
        (
            "dyn_preferred",
            # r0 joins blk; r1..r5 (order among them free) form the next batch while blk's
            # 1 s runs; r6 comes after r5 filled it. Every order that matters is 0.25 s apart.
            [Send(0.0, "blk", sleep_ms=1000), Send(0.1, "r0")]
            + [Send(0.35 + 0.04 * i, f"r{i + 1}") for i in range(5)]
            + [Send(0.8, "r6")],
            [["blk", "r0"], ["r1", "r2", "r3", "r4", "r5"], ["r6"]],
        ),
        # No delay: whatever is queued when the instance frees, up to max_batch_size 4.
        (
            "dyn_no_delay",
            [Send(0.0, "blk", sleep_ms=1500)]
            + [Send(0.25 + 0.02 * i, f"r{i}") for i in range(4)]
            + [Send(0.7, "r4"), Send(0.72, "r5")],
            [["blk"], ["r0", "r1", "r2", "r3"], ["r4", "r5"]],
        ),
        # Without a batch dimension the dynamic batcher never groups.
        (
            "dyn_unbatched",
            [Send(0.0, f"r{i}") for i in range(4)],  # at once; compared in any order
            [["r0"], ["r1"], ["r2"], ["r3"]],
        ),
        # DELAY: requests past their timeout run after the ones still in time.
        (
            "queue_delay_action",
            # Timeout 1.5 s: r0-r2 expire by 2.15 s, before blk ends at 2.7 s; "late" (sent at
            # 2.2 s) expires at 3.7 s. After an execute Triton sometimes takes the next request
            # only at its next 0.5 s poll (3.2 s here), so late needs 0.5 s beyond that too.
            [Send(0.0, "blk", sleep_ms=2700)]
            + [Send(0.25 + 0.2 * i, f"r{i}") for i in range(3)]
            + [Send(2.2, "late")],
            [["blk"], ["late"], ["r0"], ["r1"], ["r2"]],
        ),
        # allow_timeout_override without a default timeout: a request's timeout never applies.
        (
            "timeout_override",
            [
                Send(0.0, "blk", sleep_ms=800),
                Send(0.2, "t", options={"timeout": 100_000}),
                Send(0.45, "n"),
            ],
            [["blk"], ["t"], ["n"]],
        ),
    ],
    ids=[
        "delay-groups",
        "max-batch-then-rest",
        "never-split",
        "preferred-at-once",
        "large-request-alone",
        "payload-growth",
        "no-delay",
        "no-batch-dim",
        "delay-action",
        "override-without-default",
    ],
)
def test_which_requests_share_an_execute_call(batching: Pair, model, sends, expected):
    grouped = model != "dyn_unbatched"
    triton, bridge = _both(batching, model, sends, batching=grouped)
    if _calls(model, triton) != expected:
        # Triton itself, on a loaded 2-CPU machine: once in a CI rehearsal (run beside other
        # tests) a send reached it 0.25 s late and joined the next batch. The scenario is then
        # not what it tests; Triton runs it once more, and must group it as expected.
        warnings.warn(
            f"{model}: Triton grouped {_calls(model, triton)}; the scenario runs once more",
            stacklevel=1,
        )
        triton, bridge = _both(batching, model, sends, batching=grouped)
    assert _calls(model, triton) == expected
    if not TRITON_DOOR and _calls(model, bridge) != _calls(model, triton):
        # Through Dynamo's frontend, a process more between the client and the batcher: twice
        # in CI rehearsals (both passes of the whole suite and the heavy qa jobs on 2 CPUs) one
        # send reached the batcher more than 0.5 s after its time, with its connection made
        # before the clock started. The batcher itself is held to Triton's grouping through the
        # triton door, with no second try; here a difference must show twice.
        warnings.warn(
            f"{model}: through Dynamo's frontend the bridge grouped {_calls(model, bridge)}, "
            f"Triton {_calls(model, triton)}; the scenario runs once more",
            stacklevel=1,
        )
        bridge = run_scenario(batching.bridge.grpc_url, model, sends, grouped)
    assert _calls(model, bridge) == _calls(model, triton)
    assert errors(triton) == {} and errors(bridge) == {}


@pytest.mark.parametrize(
    ("model", "sends", "expected"),
    [
        # The default scheduler: one request per call, in arrival order.
        ("default_sched", [Send(0, f"r{i}") for i in range(3)], [["blk"], ["r0"], ["r1"], ["r2"]]),
        # Priority 1 overtakes the default level 2; priority 9 (> levels) is the default level.
        (
            "priorities",
            [
                Send(0, "a"),
                Send(0, "b"),
                Send(0, "c", options={"priority": 1}),
                Send(0, "d", options={"priority": 2}),
                Send(0, "e", options={"priority": 9}),
            ],
            [["blk"], ["c"], ["a"], ["b"], ["d"], ["e"]],
        ),
    ],
    ids=["default-scheduler", "priority-levels"],
)
def test_order_of_queued_requests(batching: Pair, tmp_path, model, sends, expected):
    """`blk` holds the one instance at a gate while the others queue up one by one (each seen
    in the queue before the next is sent): the order they then run in is the scheduler's."""
    triton = run_held(batching.oracle, model, "blk", sends, tmp_path / "triton")
    bridge = run_held(batching.bridge, model, "blk", sends, tmp_path / "bridge")
    assert groups(triton) == expected
    assert groups(bridge) == groups(triton)
    assert errors(triton) == {} and errors(bridge) == {}


def test_queue_full_turns_away_the_third(batching: Pair, tmp_path):
    """max_queue_size 2: with `blk` holding the instance, r0 and r1 wait, r2 and r3 are refused."""
    sends = [Send(0, f"r{i}") for i in range(4)]
    triton = run_held(batching.oracle, "queue_full", "blk", sends, tmp_path / "triton")
    bridge = run_held(batching.bridge, "queue_full", "blk", sends, tmp_path / "bridge")
    assert set(errors(triton)) == {"r2", "r3"}
    assert errors(triton)["r2"] == (
        "StatusCode.UNAVAILABLE",
        "[request id: r2] Exceeds maximum queue size",
    )
    assert errors(bridge) == _bridge_errors(triton)
    assert groups(bridge) == groups(triton) == [["blk"], ["r0"], ["r1"]]


def test_two_instances_each_take_a_batch(batching: Pair):
    sends = [Send(0.01 * i, f"r{i}", sleep_ms=200) for i in range(10)]
    triton, bridge = _both(batching, "dyn_two_instances", sends)
    # Two full batches of 4 at once, one per instance, then the last 2 after the delay.
    for outcomes in (triton, bridge):
        calls = groups(outcomes)
        assert sorted(len(ids) for ids in calls) == [2, 4, 4]
        assert sorted(rid for ids in calls for rid in ids) == sorted(f"r{i}" for i in range(10))
    assert {o.report["instance"] for o in bridge.values()} == {
        "dyn_two_instances_0_0",
        "dyn_two_instances_0_1",
    }


@pytest.mark.parametrize(
    ("model", "sends", "failed"),
    [
        # A 200 ms queue timeout; a request's own timeout may shorten it but not lengthen it.
        (
            "queue_timeout",
            [
                Send(0.0, "blk", sleep_ms=1000),
                Send(0.25, "r0"),
                Send(0.28, "long", options={"timeout": 2_000_000}),
                Send(0.31, "short", options={"timeout": 50_000}),
            ],
            {"r0", "long", "short"},
        ),
    ],
    ids=["queue-timeout"],
)
def test_queue_policy_errors(batching: Pair, model, sends, failed):
    triton, bridge = _both(batching, model, sends)
    assert set(errors(triton)) == failed
    assert errors(triton)["r0"] == ("StatusCode.UNAVAILABLE", "Request timeout expired")
    assert errors(bridge) == _bridge_errors(triton)


def test_instance_group_kinds(batching: Pair):
    """KIND_CPU x2, KIND_MODEL, KIND_AUTO: names and initialize args as Triton gives them."""
    sends = [Send(0.0, f"g{i}", sleep_ms=500) for i in range(4)]
    triton, bridge = _both(batching, "groups", sends, batching=False)

    def instances(outcomes: dict) -> set:
        return {
            (o.report["instance"], o.report["kind"], o.report["device"]) for o in outcomes.values()
        }

    assert instances(triton) == {
        ("groups_0_0", "CPU", "0"),
        ("groups_0_1", "CPU", "0"),
        ("groups_1_0", "MODEL", "0"),
        ("groups_2_0", "CPU", "0"),
    }
    assert instances(bridge) == instances(triton)


# -- sequences ------------------------------------------------------------------------------------


def _steps(model: str) -> list[tuple[str, int, bool, bool]]:
    # (request id, sequence id, start, end), sent one after another.
    return [
        ("a1", 11, True, False),
        ("b1", 12, True, False),
        ("c1", 13, True, False),
        ("a2", 11, False, False),
        ("b2", 12, False, True),
        ("a3", 11, False, True),
        ("c2", 13, False, True),
    ]


def _run_sequence(server, model: str, batching: bool) -> dict:
    client = server.client()
    out = {}
    for rid, sid, start, end in _steps(model):
        options = {"sequence_id": sid, "sequence_start": start, "sequence_end": end}
        out[rid] = infer(client, model, Send(0, rid, options=options), batching)
    return out


@pytest.mark.parametrize("model", ["seq_direct", "seq_oldest"])
def test_sequence_routing_and_controls(sequence: Pair, model: str):
    triton = _run_sequence(sequence.oracle, model, True)
    bridge = _run_sequence(sequence.bridge, model, True)
    for outcomes in (triton, bridge):
        assert all(o.ok for o in outcomes.values()), errors(outcomes)
        # Running sums kept per instance: right only if each sequence stayed on one instance.
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
        assert where["a1"] == where["a2"] == where["a3"]
        assert where["b1"] == where["b2"] and where["c1"] == where["c2"]
        assert where["a1"] != where["b1"]  # the first sequences spread over the instances
    # Which instance the third sequence joins depends on the order earlier sequences freed
    # their slots (the servers may have served other tests first); from a fresh start it is
    # the second one's on both (tests/unit/test_scheduling.py::test_free_slots_follow_tritons_heap).
    # Control inputs, correlation ids and flags, request by request.
    for rid in triton:
        t, b = triton[rid].report, bridge[rid].report
        assert (b["corrid"], b["flags"], b["controls"]) == (t["corrid"], t["flags"], t["controls"])
    # Direct pads an empty lower slot with a null request (c1 shares b1's instance, slot 1).
    assert [bridge[r].report["batch"] for r in ("a1", "b1", "c1")] == [
        triton[r].report["batch"] for r in ("a1", "b1", "c1")
    ]


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
def test_sequence_request_errors(sequence: Pair, options: dict, rows: int, text: str):
    send = Send(0, "x", rows, options=options)
    triton = infer(sequence.oracle.client(), "seq_direct", send)
    bridge = infer(sequence.bridge.client(), "seq_direct", send)
    assert (triton.status, triton.message) == ("StatusCode.INVALID_ARGUMENT", text)
    expected = expected_bridge_error(Failure(triton.status, triton.message))
    assert (bridge.status, bridge.message) == (expected.status, expected.message)


def test_string_correlation_id_in_a_numeric_control(sequence: Pair):
    options = {"sequence_id": "abc", "sequence_start": True, "sequence_end": True}
    send = Send(0, "s", options=options)
    triton = infer(sequence.oracle.client(), "seq_direct", send).report
    bridge = infer(sequence.bridge.client(), "seq_direct", send).report
    assert triton["controls"]["CORRID"] == [[1, 1], "uint64", [0x63626100000003]]
    assert (bridge["corrid"], bridge["controls"]) == (triton["corrid"], triton["controls"])


def test_idle_sequence_is_released(sequence: Pair):
    """seq_idle: one slot, 300 ms idle limit. A sequence that waited longer is gone (START
    error), and a new sequence waits in the backlog until the slot's sequence goes idle."""

    def run(server) -> list:
        client = server.client()

        def start(tag: str, sequence_id: int) -> bool:
            options = {"sequence_id": sequence_id, "sequence_start": True}
            return infer(client, "seq_idle", Send(0, tag, options=options), False).ok

        first = start("a1", 5)
        # No sleep: sequence 6 gets the one slot once sequence 5 went idle, so 5 is gone after.
        second = start("b1", 6)
        late = infer(client, "seq_idle", Send(0, "a2", options={"sequence_id": 5}), False)
        # b2 starts 6's idle time afresh (without it Triton gave 7 the slot within 0.2 s: it
        # seems to count 6's idle time from b1's arrival in the backlog). Sequence 7 then waits
        # the whole 300 ms from b2's arrival, which is after `began`.
        began = time.monotonic()
        more = infer(client, "seq_idle", Send(0, "b2", options={"sequence_id": 6}), False)
        backlog = start("c1", 7)
        waited = time.monotonic() - began
        return [first, second, (late.status, late.message), more.ok, backlog, waited >= 0.25]

    triton, bridge = run(sequence.oracle), run(sequence.bridge)
    start_error = (
        "inference request for sequence 5 to model 'seq_idle' must specify the START flag on "
        "the first request of the sequence"
    )
    assert triton == [True, True, ("StatusCode.INVALID_ARGUMENT", start_error), True, True, True]
    expected = expected_bridge_error(Failure("StatusCode.INVALID_ARGUMENT", start_error))
    assert bridge == [True, True, (expected.status, expected.message), True, True, True]
