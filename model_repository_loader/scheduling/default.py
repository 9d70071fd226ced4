"""Triton's default scheduler: each request runs alone on the next free instance.

The scheduler keeps a queue of pending requests and the set of idle instances. A request goes
straight to an idle instance if there is one; otherwise it waits, and the instance that finishes
next picks it up. Dispatch happens under one lock and never blocks, so callers on an event loop can
enqueue.

A request cancelled while it waits leaves the queue at once and is answered with
`fail_cancelled()`; it never reaches an instance, as Triton's schedulers do. Cancelled requests
queued behind a hung instance are so freed, not kept until the instance comes back.

A failure on the way (anything `execute`'s own guard did not catch) fails that request and the
instance takes the next one. Once closed, the scheduler answers what it still holds, and any
later request, UNAVAILABLE.

This is the path of most requests, so it works on `Pending` itself, with no per-request entry
object: the request's batch size, arrival time and statistics are already on it (model.py
builds it with them), and it counts its own outcome when its final response leaves.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence

from .. import pb_utils
from ..execution import Pending, fail_batch
from ..instance import Instance
from .entry import RunBatch, run_recorded
from .stats import ModelStats


class DefaultScheduler:
    def __init__(
        self, instances: Sequence[Instance], run_batch: RunBatch, stats: ModelStats
    ) -> None:
        self._idle: deque[Instance] = deque(instances)
        self._pending: deque[Pending] = deque()
        self._run_batch = run_batch
        self._stats = stats
        self._lock = threading.Lock()
        self._busy = 0
        self._drained = threading.Condition(self._lock)
        self._unavailable: str | None = None  # set by close(): the answer to late requests

    def enqueue(self, pending: Pending, priority: int = 0) -> None:
        """Queue one request (the default scheduler has no priorities)."""
        with self._lock:
            refused = self._unavailable
            if refused is None:
                if not self._idle:
                    self._pending.append(pending)
                    instance = None
                else:
                    instance = self._idle.popleft()
                    self._busy += 1
        if refused is not None:
            pending.fail(refused, pb_utils.TritonError.UNAVAILABLE)
        elif instance is None:
            # Registered outside the lock: it runs at once if the request is already cancelled.
            pending.on_cancel(lambda: self._cancelled(pending))
        else:
            instance.post(lambda: self._run(instance, pending))

    def _cancelled(self, pending: Pending) -> None:
        """A queued request was cancelled: out of the queue, answered CANCELLED, now."""
        with self._lock:
            try:
                self._pending.remove(pending)
            except ValueError:
                return  # an instance has it already; run_execute drops it
        pending.fail_cancelled()

    def _run(self, instance: Instance, pending: Pending | None) -> None:
        while pending is not None:
            try:
                if pending.is_cancelled():
                    pending.fail_cancelled()
                else:
                    self._execute(instance, pending)
            except BaseException as exc:  # the instance goes on with the next request
                fail_batch(instance.name, [pending], exc)
            finally:
                pending = self._next_or_idle(instance)

    def _execute(self, instance: Instance, pending: Pending) -> None:
        start = time.monotonic_ns()
        pending.left_queue()
        queue_ns = start - pending.arrival_ns
        run_recorded(
            self._run_batch,
            instance,
            [pending],
            self._stats,
            start,
            queue_ns,
            pending.batch_size,
            1,
        )
        if pending.closed:  # answered, and this scheduler reads nothing more of it
            pending.drop_request()

    def _next_or_idle(self, instance: Instance) -> Pending | None:
        with self._lock:
            if self._pending:
                return self._pending.popleft()
            self._idle.append(instance)
            self._busy -= 1
            if self._busy == 0:
                self._drained.notify_all()
            return None

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until no request is queued or executing. Returns False on timeout."""
        with self._lock:
            return self._drained.wait_for(
                lambda: self._busy == 0 and not self._pending, timeout=timeout
            )

    def close(self, unavailable: str) -> None:
        """Stop: answer every queued request, and every later one, UNAVAILABLE `unavailable`."""
        with self._lock:
            self._unavailable = unavailable
            queued, self._pending = self._pending, deque()
            self._drained.notify_all()
        for pending in queued:
            pending.fail(unavailable, pb_utils.TritonError.UNAVAILABLE)
