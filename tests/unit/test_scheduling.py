"""The schedulers in-process (no server): statistics, cancellation, stacking, ordering, queue
policy and sequence controls. Models are tests/repositories/batching and sequence (READMEs);
expected behaviour is Triton's (spec §3.7, §3.8, §3.15, tests/differential/test_diff_batching.py).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from model_repository_loader import pb_utils
from model_repository_loader.inference import InferRequest
from model_repository_loader.loader import LoadedRepository, load_repository
from model_repository_loader.scheduling.controls import Controls, numeric_corrid
from model_repository_loader.scheduling.entry import Entry
from model_repository_loader.scheduling.queue_policy import PriorityQueues, QueueFull
from model_repository_loader.scheduling.slots import FreeSlots
from model_repository_loader.scheduling.stats import ModelStats

WAIT_S = 30.0
_FINISHED = itertools.count(1)


@pytest.fixture(scope="module")
def batching(repository: Callable[[str], Path]) -> Iterator[LoadedRepository]:
    repo = load_repository([repository("batching")])  # its models share one model.py
    yield repo
    repo.close()


class Call:
    """One submitted request and everything that came back for it."""

    def __init__(self, repo: LoadedRepository, model: str, rid: str, rows: int = 1, **params):
        self.responses: list[pb_utils.InferenceResponse | None] = []
        self.done = threading.Event()
        self.finished = 0  # the order in which requests got their final response (1, 2, ...)
        shape = (rows, 1) if repo.models[model].config.max_batch_size else (1,)
        array = np.full(shape, rows, np.int32)
        request = InferRequest(
            inputs=[pb_utils.Tensor("IN", array)], request_id=rid, parameters=dict(params)
        )
        self.pending = repo.models[model].submit(request, self._respond)

    def _respond(self, response: pb_utils.InferenceResponse | None, final: bool) -> None:
        self.responses.append(response)
        if final:
            self.finished = next(_FINISHED)
            self.done.set()

    def wait(self) -> pb_utils.InferenceResponse:
        assert self.done.wait(WAIT_S), "no final response"
        return self.responses[-1]

    def report(self) -> dict:
        response = self.wait()
        assert not response.has_error(), response.error().message()
        tensor = pb_utils.get_output_tensor_by_name(response, "REPORT")
        return json.loads(tensor.as_numpy().ravel()[0])


def test_statistics_of_a_dynamic_batch(batching: LoadedRepository):
    """Triton's QA case: 4 batch-2 requests batched into one call give inference_count 8,
    execution_count 1 and one batch_stats entry of batch size 8 (spec §3.15)."""
    stats = batching.models["dyn_delay"].latest.stats
    calls = [Call(batching, "dyn_delay", f"s{i}", rows=2) for i in range(4)]
    reports = [c.report() for c in calls]
    assert {tuple(r["ids"]) for r in reports} == {("s0", "s1", "s2", "s3")}
    snap = stats.snapshot()
    assert (snap.inference_count, snap.execution_count) == (8, 1)
    assert [b.batch_size for b in snap.batch_stats] == [8]
    assert snap.batch_stats[0].compute_infer.count == 1
    assert snap.success.count == 4 and snap.fail.count == 0
    assert snap.queue.count == 4 and snap.compute_infer.count == 4
    assert snap.queue.ns > 0 and snap.compute_infer.ns > 0 and snap.last_inference_ms > 0


def gate_params(folder: Path, tag: str) -> dict[str, str]:
    """Parameters that hold the batching model's execute until `open_gate(folder)`."""
    return {"started": str(folder / f"started-{tag}"), "gate": str(folder / "gate")}


def open_gate(folder: Path) -> None:
    (folder / "gate").touch()


def test_failed_requests_are_counted_as_failures(batching: LoadedRepository, tmp_path: Path):
    stats = batching.models["queue_full"].latest.stats
    # blk holds the only instance (out of the queue); q0, q1 fill the queue of 2, q2 is refused.
    calls = [Call(batching, "queue_full", "blk", **gate_params(tmp_path, "blk"))]
    _wait_for((tmp_path / "started-blk").exists)
    calls += [Call(batching, "queue_full", f"q{i}") for i in range(3)]
    assert calls[-1].done.wait(WAIT_S) and stats.snapshot().queued == 2
    open_gate(tmp_path)
    for call in calls:
        call.wait()
    rejected = [c for c in calls if c.responses[-1].has_error()]
    assert len(rejected) == 1
    assert rejected[0].responses[-1].error().message() == (
        "[request id: q2] Exceeds maximum queue size"
    )
    assert rejected[0].responses[-1].error().code() == pb_utils.TritonError.UNAVAILABLE
    snap = stats.snapshot()
    assert (snap.success.count, snap.fail.count, snap.execution_count) == (3, 1, 3)
    # Triton's failure reason for a full queue, and nothing left waiting.
    assert snap.failures == {"REJECTED": 1, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}
    assert snap.queued == 0


def test_a_request_cancelled_in_the_queue_is_not_executed(batching: LoadedRepository):
    stats = batching.models["dyn_delay"].latest.stats
    cancelled_before = stats.snapshot().failures["CANCELED"]
    kept = Call(batching, "dyn_delay", "kept")
    dropped = Call(batching, "dyn_delay", "dropped")
    assert stats.snapshot().queued == 2  # both wait out the queue delay
    dropped.pending.cancel()  # well inside the 300 ms queue delay
    assert kept.report()["ids"] == ["kept"]
    response = dropped.wait()
    assert response.has_error()
    assert response.error().code() == pb_utils.TritonError.CANCELLED
    snap = stats.snapshot()
    assert snap.failures["CANCELED"] == cancelled_before + 1
    assert snap.queued == 0


def test_stacking_hands_execute_one_request(batching: LoadedRepository):
    """bridge_stack_batch: the batch arrives as one request; outputs are split back."""
    calls = [Call(batching, "stacked", rid, rows=rows) for rid, rows in (("a", 1), ("b", 2))]
    calls.append(Call(batching, "stacked", "c", rows=3))
    for call, rows in zip(calls, (1, 2, 3), strict=True):
        report = call.report()
        assert report["ids"] == ["a"]  # one request, the first one's id
        assert report["sizes"] == [6]
        out = pb_utils.get_output_tensor_by_name(call.wait(), "OUT").as_numpy()
        np.testing.assert_array_equal(out, np.full((rows, 1), rows, np.int32))


def test_preserve_ordering_holds_later_responses(batching: LoadedRepository, tmp_path: Path):
    """Several instances: with preserve_ordering the slow first request still answers first."""

    def run(model: str) -> list[str]:
        folder = tmp_path / model
        folder.mkdir()
        stats = batching.models[model].latest.stats
        slow = Call(batching, model, "slow", **gate_params(folder, "slow"))
        _wait_for((folder / "started-slow").exists)
        executed = stats.snapshot().execution_count
        fast = Call(batching, model, "fast")  # on another instance, while slow is held
        # fast's execute has returned (its response delivered, or held back).
        _wait_for(lambda: stats.snapshot().execution_count == executed + 1)
        open_gate(folder)
        fast.wait(), slow.wait()
        return sorted(
            ["slow", "fast"], key=lambda name: {"slow": slow, "fast": fast}[name].finished
        )

    assert run("groups") == ["fast", "slow"]  # without it, the fast one comes first
    assert run("dyn_ordered") == ["slow", "fast"]


# -- queue policy --------------------------------------------------------------------------------


def _entry(priority: int = 0) -> Entry:
    return Entry(pending=None, priority=priority)  # type: ignore[arg-type]


def test_priority_levels_and_default_level():
    batching = mc.ModelDynamicBatching(priority_levels=3, default_priority_level=2)
    queues = PriorityQueues(batching)
    entries = {p: _entry(p) for p in (0, 1, 2, 3, 7)}
    for entry in entries.values():
        queues.push(entry, 0, 0)
    # Priority 0 and 7 (> levels) mean the default level 2; inside a level, arrival order.
    assert list(queues) == [entries[1], entries[0], entries[2], entries[7], entries[3]]
    assert not queues.prefetch


def test_queue_size_and_timeouts():
    policy = mc.ModelQueuePolicy(
        max_queue_size=2, default_timeout_microseconds=1000, allow_timeout_override=True
    )
    queues = PriorityQueues(mc.ModelDynamicBatching(default_queue_policy=policy))
    short, default = _entry(), _entry()
    queues.push(short, 500, 0)  # shortens the timeout
    queues.push(default, 5000, 0)  # may not lengthen it
    with pytest.raises(QueueFull):
        queues.push(_entry(), 0, 0)
    assert (short.deadline_ns, default.deadline_ns) == (500_000, 1_000_000)
    assert queues.expire(600_000) == [short]
    assert queues.expire(1_000_000) == [default]
    assert len(queues) == 0


def test_delay_action_moves_expired_requests_behind():
    policy = mc.ModelQueuePolicy(
        timeout_action=mc.ModelQueuePolicy.DELAY, default_timeout_microseconds=1
    )
    queues = PriorityQueues(mc.ModelDynamicBatching(default_queue_policy=policy))
    old, new = _entry(), _entry()
    queues.push(old, 0, 0)
    queues.push(new, 0, 10_000)
    assert queues.expire(5_000) == []
    assert list(queues) == [new, old]


def test_plain_queue_prefetches():
    assert PriorityQueues(mc.ModelDynamicBatching()).prefetch


# -- sequence controls ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("corrid", "expected"),
    [
        (7, 7),
        ("abc", 0x63626100000003),  # [V] on Triton 2.51
        ("0", 206158430209),
        ("abcdefghij", 7233733595238498314),
    ],
)
def test_numeric_correlation_id(corrid, expected):
    assert numeric_corrid(corrid) == expected


def test_control_tensors():
    config = mc.ModelConfig()
    text_format.Parse(
        """sequence_batching { control_input [
          { name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
          { name: "E" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] } ] },
          { name: "R" control [
            { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
          { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_INT64 } ] } ] }""",
        config,
    )
    tensors = Controls(config.sequence_batching, batched_model=True).tensors(9, 1, ready=True)
    got = {t.name(): (t.as_numpy().dtype.name, t.as_numpy().tolist()) for t in tensors}
    assert got == {
        "S": ("int32", [[1]]),
        "E": ("float32", [[0.0]]),
        "R": ("bool", [[True]]),
        "C": ("int64", [[9]]),
    }
    flat = Controls(config.sequence_batching, batched_model=False).tensors(9, 2, ready=False)
    assert {t.name(): t.as_numpy().tolist() for t in flat} == {
        "S": [0],
        "E": [1.0],
        "R": [False],
        "C": [9],
    }


def test_model_stats_snapshot_is_a_copy():
    stats = ModelStats()
    stats.record_execution(
        batch_size=3, requests=2, queue_ns=4, input_ns=1, infer_ns=10, output_ns=2
    )
    snap = stats.snapshot()
    stats.record_execution(
        batch_size=3, requests=1, queue_ns=4, input_ns=1, infer_ns=10, output_ns=2
    )
    assert (snap.execution_count, snap.compute_infer.count, snap.compute_infer.ns) == (1, 2, 20)
    assert (snap.queue.count, snap.queue.ns) == (2, 4)
    assert stats.snapshot().batch_stats[0].compute_infer.count == 2


def test_free_slots_follow_tritons_heap():
    """Two instances: slot 0 of each, then slot 1 of the second instance (the instance of the
    second sequence), as Triton placed three sequences [V]; a released slot comes back first."""
    free = FreeSlots(instances=2, slots_per_instance=4)
    assert [free.pop() for _ in range(3)] == [(0, 0), (1, 0), (1, 1)]
    free.push((0, 0))
    assert free.pop() == (0, 0)
    assert len(free) == 5


# -- request rescheduling (iterative_sequence) ---------------------------------------------------


@pytest.fixture(scope="module")
def sequences(repository: Callable[[str], Path]) -> Iterator[LoadedRepository]:
    repo = load_repository([repository("sequence")])  # its models share one model.py
    yield repo
    repo.close()


def _sequence_call(repo: LoadedRepository, value: int, **params) -> pb_utils.InferenceResponse:
    done = threading.Event()
    responses: list = []

    def respond(response, final):
        responses.append(response)
        if final:
            done.set()

    request = InferRequest(
        inputs=[pb_utils.Tensor("IN", np.array([value], np.int32))],
        request_id="it",
        parameters=dict(params),
    )
    repo.models["seq_iterative"].submit(request, respond)
    assert done.wait(WAIT_S)
    return responses[-1]


def test_rescheduled_request_runs_again_on_its_slot(sequences: LoadedRepository):
    """As on Triton 2.51: a request released with RESCHEDULE runs until done (3 runs), its
    later runs carry no START flag, and once it is done the sequence is over."""
    response = _sequence_call(sequences, 3, sequence_id=3, sequence_start=True)
    assert not response.has_error(), response.error().message()
    assert pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy().tolist() == [3]
    report = json.loads(pb_utils.get_output_tensor_by_name(response, "REPORT").as_numpy()[0])
    assert (report["corrid"], report["flags"]) == (3, 0)
    follow_up = _sequence_call(sequences, 1, sequence_id=3, sequence_end=True)
    assert follow_up.error().message() == (
        "inference request for sequence 3 to model 'seq_iterative' must specify the START flag "
        "on the first request of the sequence"
    )


def test_a_request_outside_any_sequence_starts_its_own(sequences: LoadedRepository):
    """Triton's IterativeSequencer: no correlation ID on an iterative model's request gives it a
    sequence of its own, numbered by the model's scheduler, with the START flag (the model sees
    both), instead of the refusal a non-iterative sequence model answers."""
    first = _sequence_call(sequences, 1)
    assert not first.has_error(), first.error().message()
    report = json.loads(pb_utils.get_output_tensor_by_name(first, "REPORT").as_numpy()[0])
    assert report["flags"] == pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
    assert isinstance(report["corrid"], int) and report["corrid"] > 0
    rescheduled = _sequence_call(sequences, 2)
    assert pb_utils.get_output_tensor_by_name(rescheduled, "OUT").as_numpy().tolist() == [2]
    second = json.loads(pb_utils.get_output_tensor_by_name(rescheduled, "REPORT").as_numpy()[0])
    assert second["flags"] == 0 and second["corrid"] not in (0, report["corrid"])


# -- the dynamic batcher on its own: shapes and allow_ragged_batch --------------------------------


class _HeldInstance:
    """An instance whose calls wait until the test runs them."""

    def __init__(self) -> None:
        self.name = "held_0"
        self.calls: list = []

    def post(self, fn) -> None:
        self.calls.append(fn)


def _wait_for(predicate) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, "the batcher never got there"
        time.sleep(0.001)


def _batches_for(shapes: list[int], ragged: bool) -> list[list[str]]:
    from model_repository_loader.execution import Pending
    from model_repository_loader.scheduling.dynamic import DynamicBatcher

    config = mc.ModelConfig(name="m", max_batch_size=8)
    config.input.add(name="IN", data_type=mc.TYPE_INT32, dims=[-1], allow_ragged_batch=ragged)
    config.dynamic_batching.SetInParent()
    instance = _HeldInstance()
    seen: list[list[str]] = []

    def run_batch(_instance, batch) -> None:
        seen.append([p.request.request_id() for p in batch])

    batcher = DynamicBatcher(config, [instance], run_batch, ModelStats())
    for i, width in enumerate(shapes):
        array = np.zeros((1, width), np.int32)
        request = pb_utils.InferenceRequest._incoming(
            inputs=[pb_utils.Tensor("IN", array)],
            request_id=f"r{i}",
            requested_output_names=set(),
            response_sender=None,
        )
        pending = Pending(request, lambda response, final: None)
        batcher.enqueue(pending)
        if i == 0:  # r0 must be on the (free) instance before the others arrive
            _wait_for(lambda: instance.calls)
    if ragged:  # r1..r3 must all be in the waiting payload before r0 finishes
        _wait_for(lambda: not len(batcher._queue))
    deadline = time.monotonic() + WAIT_S
    while sum(map(len, seen)) < len(shapes) and time.monotonic() < deadline:
        if instance.calls:
            instance.calls.pop(0)()
        time.sleep(0.01)
    batcher.close("closed")
    return seen


def test_batches_hold_one_shape_unless_ragged():
    """r0 runs alone (the instance was free); the rest queue behind it. Widths 2, 3, 2: without
    allow_ragged_batch a different non-batch shape closes the batch (spec §3.2)."""
    assert _batches_for([2, 2, 3, 2], ragged=False) == [["r0"], ["r1"], ["r2"], ["r3"]]
    assert _batches_for([2, 2, 3, 2], ragged=True) == [["r0"], ["r1", "r2", "r3"]]
