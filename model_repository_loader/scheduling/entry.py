"""What the schedulers keep for each queued request, and the steps every scheduler shares:
skipping cancelled requests, running a batch under its rate limit, timing, and statistics."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import pb_utils
from ..execution import Pending, take_compute_span
from ..instance import Instance
from .rate_limiter import LimitedInstance, Withdrawn, take_wait_ns
from .stats import ModelStats

RunBatch = Callable[[Instance, list[Pending]], None]


class BatchRunner:
    """The one way a batch reaches an instance, for every scheduler and warmup: `execute`,
    while the instance holds its rate limiter resources (Triton runs warmup samples through its
    rate limiter too).

    Built by the model version with its table of instance name → place in the rate limiter
    (empty without one; the version fills it at load and empties it at close), so running a
    batch goes down to the instance without a call back into the version.
    """

    __slots__ = ("_decoupled", "_limited", "_unavailable")

    def __init__(
        self, decoupled: bool, limited: Mapping[str, LimitedInstance], unavailable: str
    ) -> None:
        self._decoupled = decoupled
        self._limited = limited
        self._unavailable = unavailable  # the answer when the version closes meanwhile

    def __call__(self, instance: Instance, batch: list[Pending]) -> None:
        limited = self._limited.get(instance.name)
        if limited is None:
            instance.run_batch(batch, self._decoupled)
            return
        try:
            with limited.hold():
                instance.run_batch(batch, self._decoupled)
        except Withdrawn:  # the version closed while this batch waited for resources
            for pending in batch:
                pending.fail(self._unavailable, pb_utils.TritonError.UNAVAILABLE)


@dataclass(slots=True, eq=False)
class Entry:
    """One request waiting in a scheduler."""

    pending: Pending
    # When it entered this queue (again, for a rescheduled request): queue time counts from here.
    arrival_ns: int = field(default_factory=time.monotonic_ns)
    priority: int = 0
    # Absolute monotonic deadline (ns) after which the queue policy applies; 0 = none.
    deadline_ns: int = 0
    # Same-shape key: requests batched together must agree on it (allow_ragged_batch aside).
    shape_key: tuple[Any, ...] = ()
    # The request's own inputs, before a scheduler added control tensors to them.
    base_inputs: list[Any] | None = None
    rescheduled: bool = False

    @property
    def batch_size(self) -> int:
        """The request's batch dimension, as validation found it (Pending is built with it)."""
        return self.pending.batch_size


def drop_if_cancelled(entry: Entry) -> bool:
    """True (and the request answered CANCELLED) if the client cancelled while it was queued."""
    pending = entry.pending
    if not pending.is_cancelled():
        return False
    pending.fail_cancelled()
    return True


def run_timed(
    run_batch: RunBatch,
    instance: Instance,
    entries: Sequence[Entry],
    stats: ModelStats,
    pendings: list[Pending] | None = None,
) -> None:
    """Run one `execute` call over `entries` and record queue and compute times.

    `pendings` is what `execute` really gets when it differs from the entries (a stacked
    request, or sequence slots padded with null requests).
    """
    start = time.monotonic_ns()
    queue_ns = sum(start - entry.arrival_ns for entry in entries)
    for entry in entries:  # no longer pending: its execute starts (even as part of a stack)
        entry.pending.left_queue()
    executed = pendings if pendings is not None else [e.pending for e in entries]
    batch_size = sum(e.batch_size for e in entries)
    run_recorded(run_batch, instance, executed, stats, start, queue_ns, batch_size, len(entries))


def run_recorded(
    run_batch: RunBatch,
    instance: Instance,
    executed: list[Pending],
    stats: ModelStats,
    start_ns: int,
    queue_ns: int,
    batch_size: int,
    requests: int,
) -> None:
    """Run `execute` over `executed`; record the execution (the one place schedulers do).

    The default scheduler calls this directly with its one request, skipping `Entry`s.
    """
    for pending in executed:
        pending.executing()
    take_compute_span()  # nothing left over from an earlier call on this thread
    take_wait_ns()
    try:
        run_batch(instance, executed)
    finally:
        end_ns = time.monotonic_ns()
        # A wait for rate limiter resources is queue time, as in Triton, not compute time.
        waited = take_wait_ns()
        start_ns += waited
        queue_ns += waited * requests
        span = take_compute_span()
        if span is not None and not start_ns <= span[0] <= span[1] <= end_ns:
            span = None
        if span is not None:
            input_ns, infer_ns, output_ns = span[0] - start_ns, span[1] - span[0], end_ns - span[1]
        else:
            input_ns, infer_ns, output_ns = 0, end_ns - start_ns, 0
        stats.record_execution(batch_size, requests, queue_ns, input_ns, infer_ns, output_ns)
        for pending in executed:
            if pending.trace is not None:
                pending.trace.computed(start_ns, span, end_ns)
            pending.executed()
