"""Triton's default scheduler: each request runs alone on the next free instance.

The scheduler keeps a queue of pending work and the set of idle instances. A request goes straight
to an idle instance if there is one; otherwise it waits, and the instance that finishes next picks
it up. Dispatch happens under one lock and never blocks, so callers on an event loop can enqueue.

A request cancelled while it waits is answered with `fail_cancelled()` when its turn comes and never
reaches an instance, as Triton's schedulers do.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

from ..instance import ModelInstance


class Cancellable(Protocol):
    def is_cancelled(self) -> bool: ...

    def fail_cancelled(self) -> None: ...


Work = TypeVar("Work", bound=Cancellable)
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
        cancelled: list[Work] = []
        try:
            with self._lock:
                while self._pending:
                    work = self._pending.popleft()
                    if not work.is_cancelled():
                        return [work]
                    cancelled.append(work)
                self._go_idle(instance)
                return []
        finally:
            for work in cancelled:  # answered outside the lock: it calls back into the caller
                work.fail_cancelled()

    def _go_idle(self, instance: ModelInstance) -> None:
        # Called with the lock held.
        self._idle.append(instance)
        self._busy -= 1
        if self._busy == 0:
            self._drained.notify_all()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until no request is queued or executing. Returns False on timeout."""
        with self._lock:
            return self._drained.wait_for(
                lambda: self._busy == 0 and not self._pending, timeout=timeout
            )
