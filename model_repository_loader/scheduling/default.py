"""Triton's default scheduler: each request runs alone on the next free instance.

The scheduler keeps a queue of pending requests and the set of idle instances. A request goes
straight to an idle instance if there is one; otherwise it waits, and the instance that finishes
next picks it up. Dispatch happens under one lock and never blocks, so callers on an event loop can
enqueue.

A request cancelled while it waits is answered with `fail_cancelled()` when its turn comes and never
reaches an instance, as Triton's schedulers do.

This is the path of most requests, so it works on `Pending` itself, with no per-request entry
object: the request's batch size, arrival time and statistics are already on it (model.py sets
them), and it counts its own outcome when its final response leaves.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence

from ..execution import Pending
from ..instance import ModelInstance
from .entry import RunBatch
from .stats import ModelStats


class DefaultScheduler:
    def __init__(
        self, instances: Sequence[ModelInstance], run_batch: RunBatch, stats: ModelStats
    ) -> None:
        self._idle: deque[ModelInstance] = deque(instances)
        self._pending: deque[Pending] = deque()
        self._run_batch = run_batch
        self._stats = stats
        self._lock = threading.Lock()
        self._busy = 0
        self._drained = threading.Condition(self._lock)

    def enqueue(self, pending: Pending, priority: int = 0) -> None:
        """Queue one request (the default scheduler has no priorities)."""
        with self._lock:
            if not self._idle:
                self._pending.append(pending)
                return
            instance = self._idle.popleft()
            self._busy += 1
        instance.submit(lambda: self._run(instance, pending))

    def _run(self, instance: ModelInstance, pending: Pending | None) -> None:
        while pending is not None:
            try:
                if pending.is_cancelled():
                    pending.fail_cancelled()
                else:
                    self._execute(instance, pending)
            finally:
                pending = self._next_or_idle(instance)

    def _execute(self, instance: ModelInstance, pending: Pending) -> None:
        start = time.monotonic_ns()
        pending.left_queue()
        self._run_batch(instance, [pending])
        infer_ns = time.monotonic_ns() - start
        self._stats.record_execution(
            pending.batch_size, 1, start - pending.arrival_ns, 0, infer_ns, 0
        )
        if pending.closed:
            # Answered, and this scheduler reads nothing more of it. Dropping the link breaks
            # the cycle Pending → request → response sender → Pending, so the request is freed
            # by reference counting instead of waiting for the cyclic collector.
            pending.request = None  # type: ignore[assignment]

    def _next_or_idle(self, instance: ModelInstance) -> Pending | None:
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

    def close(self) -> None:
        return None
