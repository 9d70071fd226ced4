"""Triton's default scheduler: each request runs alone on the next free instance.

The scheduler keeps a queue of pending work and the set of idle instances. A request goes straight
to an idle instance if there is one; otherwise it waits, and the instance that finishes next picks
it up. Dispatch happens under one lock and never blocks, so callers on an event loop can enqueue.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from ..instance import ModelInstance

Work = TypeVar("Work")
RunBatch = Callable[[ModelInstance, list[Work]], None]


class DefaultScheduler(Generic[Work]):
    def __init__(self, instances: Sequence[ModelInstance], run_batch: RunBatch[Work]) -> None:
        self._idle: deque[ModelInstance] = deque(instances)
        self._pending: deque[Work] = deque()
        self._run_batch = run_batch
        self._lock = threading.Lock()
        self._busy = 0
        self._drained = threading.Condition(self._lock)

    def enqueue(self, work: Work) -> None:
        with self._lock:
            if not self._idle:
                self._pending.append(work)
                return
            instance = self._idle.popleft()
            self._busy += 1
        instance.submit(lambda: self._run(instance, [work]))

    def _run(self, instance: ModelInstance, batch: list[Work]) -> None:
        while batch:
            try:
                self._run_batch(instance, batch)
            finally:
                batch = self._next_batch_or_idle(instance)

    def _next_batch_or_idle(self, instance: ModelInstance) -> list[Work]:
        with self._lock:
            if self._pending:
                return [self._pending.popleft()]
            self._idle.append(instance)
            self._busy -= 1
            if self._busy == 0:
                self._drained.notify_all()
            return []

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until no request is queued or executing. Returns False on timeout."""
        with self._lock:
            return self._drained.wait_for(
                lambda: self._busy == 0 and not self._pending, timeout=timeout
            )
