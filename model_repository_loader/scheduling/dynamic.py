"""Triton's dynamic batcher: `execute` receives a list of requests batched together.

One batcher thread per model version turns the queue into *payloads* (the request lists handed to
`execute`) with Triton's rules, checked against the real server:

* a payload's summed batch size never exceeds `max_batch_size`; a request is never split, so one
  whose batch size reaches the largest preferred size on its own goes alone [V];
* requests of a payload agree on every non-batch dimension, except inputs with
  `allow_ragged_batch`;
* a payload that reaches a preferred batch size goes at once; otherwise the batcher waits until
  the oldest request has waited `max_queue_delay_microseconds` (0: no waiting) [V];
* while every instance is busy, the next payload is formed ahead and keeps growing until it
  reaches the largest preferred size, as Triton's payload prefetching does [V]; with a queue
  policy (timeouts, size limit, priorities) requests instead wait in the queue (queue_policy.py);
* `max_batch_size: 0` keeps the queue policy but never batches [V].

A request cancelled while it waits (in the queue, or in a payload no instance has taken yet) leaves
at once and is answered CANCELLED. A payload whose run raised fails its requests and the instance
goes on; the batcher thread itself fails what it holds rather than die. Once closed, the batcher
answers what it still holds, and every later request, UNAVAILABLE.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from functools import partial

from tritonclient.grpc import model_config_pb2 as mc

from .. import pb_utils
from ..execution import Pending, fail_batch
from ..instance import Instance
from .entry import Entry, RunBatch, drop_if_cancelled, run_timed
from .ordering import InOrder
from .queue_policy import TIMEOUT_EXPIRED, PriorityQueues, QueueFull
from .stacking import stacked_pending
from .stats import ModelStats


def request_prefix(request_id: str) -> str:
    return f"[request id: {request_id or '<id_unknown>'}] "


class _Payload:
    __slots__ = ("entries", "size", "shape_key", "started", "saturated")

    def __init__(self, shape_key: tuple) -> None:
        self.entries: list[Entry] = []
        self.size = 0
        self.shape_key = shape_key
        self.started = False
        self.saturated = False

    def add(self, entries: Sequence[Entry]) -> None:
        self.entries.extend(entries)
        self.size += sum(e.batch_size for e in entries)


class DynamicBatcher:
    def __init__(
        self,
        config: mc.ModelConfig,
        instances: Sequence[Instance],
        run_batch: RunBatch,
        stats: ModelStats,
        *,
        stack: bool = False,
    ) -> None:
        batching = config.dynamic_batching
        self._batching = config.max_batch_size > 0
        self._max_batch = max(1, config.max_batch_size)
        self._preferred = (
            frozenset(batching.preferred_batch_size) if self._batching else frozenset()
        )
        self._max_preferred = max(self._preferred, default=self._max_batch)
        self._delay_ns = batching.max_queue_delay_microseconds * 1000
        self._ragged = frozenset(i.name for i in config.input if i.allow_ragged_batch)
        self._queue = PriorityQueues(batching)
        self._in_order = InOrder() if batching.preserve_ordering else None
        self._stack = stack
        self._run_batch = run_batch
        self._stats = stats
        self._instance_count = len(instances)
        self._idle: deque[Instance] = deque(instances)
        self._ready: deque[_Payload] = deque()  # formed, waiting for an instance
        self._current: _Payload | None = None  # the newest payload, which may still grow
        self._busy = 0
        self._unavailable: str | None = None  # set by close(): the answer to late requests
        self._cond = threading.Condition()
        # Started with the first request, so a version that never serves leaves no thread.
        self._thread = threading.Thread(
            target=self._batch_forever, name=f"batcher:{config.name}", daemon=True
        )

    # -- the way in ---------------------------------------------------------------------------

    def enqueue(self, pending: Pending, priority: int = 0) -> None:
        request = pending.request
        entry = Entry(pending, priority=priority, shape_key=self._shape_key(request))
        with self._cond:
            if self._unavailable is not None:
                refused, message = True, self._unavailable
            else:
                refused = False
                if self._thread.ident is None:
                    self._thread.start()
                try:
                    self._queue.push(entry, request.timeout(), entry.arrival_ns)
                except QueueFull as exc:
                    refused, message = True, request_prefix(request.request_id()) + str(exc)
                else:
                    if self._in_order is not None:
                        self._in_order.wrap(pending)
                    self._cond.notify_all()
        if refused:
            pending.fail(message, pb_utils.TritonError.UNAVAILABLE)
            return
        # Registered outside the lock: it runs at once if the request is already cancelled.
        pending.on_cancel(lambda: self._cancelled(entry))

    def _cancelled(self, entry: Entry) -> None:
        """A waiting request was cancelled: out of the queue (or its payload), answered now."""
        with self._cond:
            if not self._queue.remove(entry) and not self._leave_payload(entry):
                return  # an instance has it already; run_execute drops it
            self._cond.notify_all()
        entry.pending.fail_cancelled()

    def _leave_payload(self, entry: Entry) -> bool:
        """Take `entry` out of a formed payload that no instance has started (under the lock)."""
        for payload in self._ready:
            if entry in payload.entries:
                payload.entries.remove(entry)
                payload.size -= entry.batch_size
                if not payload.entries:
                    self._ready.remove(payload)
                    if self._current is payload:
                        self._current = None
                return True
        return False

    def _shape_key(self, request: pb_utils.InferenceRequest) -> tuple:
        if not self._batching:
            return ()
        return tuple(
            sorted(
                (t.name(), tuple(t.shape()[1:]))
                for t in request._inputs
                if t.name() not in self._ragged
            )
        )

    # -- forming payloads ---------------------------------------------------------------------

    def _batch_forever(self) -> None:
        with self._cond:
            while self._unavailable is None:
                try:
                    now = time.monotonic_ns()
                    for entry in self._queue.expire(now):
                        entry.pending.fail(TIMEOUT_EXPIRED, pb_utils.TritonError.UNAVAILABLE)
                    wait_ns = self._form_payloads(now)
                    deadline = self._queue.next_deadline()
                except BaseException as exc:
                    # Fail what is queued rather than retry the same failure in a loop, and
                    # keep the thread: later requests still need it.
                    stranded = self._queue.take(len(self._queue))
                    fail_batch(self._thread.name, [e.pending for e in stranded], exc)
                    continue
                if deadline:
                    until_deadline = max(0, deadline - now)
                    wait_ns = until_deadline if wait_ns is None else min(wait_ns, until_deadline)
                self._cond.wait(None if wait_ns is None else wait_ns / 1e9)

    def _slot_available(self) -> bool:
        if self._queue.prefetch:
            return len(self._ready) < self._instance_count
        return not self._ready and bool(self._idle)

    def _form_payloads(self, now: int) -> int | None:
        """Move queued requests into payloads; returns ns to wait, None to wait for news."""
        while len(self._queue):
            growing = self._current
            if growing is not None and (growing.started or growing.saturated):
                growing = None
            if growing is None and not self._slot_available():
                return None
            take, saturated, wait_ns = self._plan(growing, now)
            if take == 0:
                if saturated and growing is not None:
                    growing.saturated = True
                    continue
                return wait_ns
            entries = [e for e in self._queue.take(take) if not drop_if_cancelled(e)]
            if not entries:
                continue
            if growing is None:
                growing = _Payload(entries[0].shape_key)
                self._ready.append(growing)
                self._current = growing
            growing.add(entries)
            growing.saturated = growing.saturated or saturated
            self._dispatch()
        return None

    def _plan(self, payload: _Payload | None, now: int) -> tuple[int, bool, int | None]:
        """Triton's batch decision over the queue: (requests to move now, whether the payload
        is then full, ns to wait when none move)."""
        base = payload.size if payload is not None else 0
        shape = payload.shape_key if payload is not None else None
        pending = count = best = 0
        saturated = send_now = False
        oldest = now
        for entry in self._queue:
            size = max(1, entry.batch_size)
            if base + pending == 0:
                shape = entry.shape_key
            else:
                if base + pending + size > self._max_preferred and best == 0:
                    best = count
                    saturated = True
                if base + pending + size > self._max_batch or entry.shape_key != shape:
                    send_now = True
                    break
            pending += size
            count += 1
            oldest = min(oldest, entry.arrival_ns)
            if base + pending in self._preferred:
                best = count
        delay_exceeded = self._delay_ns != 0 and now - oldest >= self._delay_ns
        if best and not delay_exceeded:
            return best, saturated or self._delay_ns == 0, None
        if count == 0:
            # The waiting payload cannot take the next request (size or shape): it is full.
            return 0, send_now, None
        if send_now or base + pending >= self._max_preferred:
            return count, True, None
        if delay_exceeded or self._delay_ns == 0:
            return count, saturated, None
        if payload is not None and base not in self._preferred:
            return count, saturated, None  # grow the waiting payload rather than hold back
        return 0, False, self._delay_ns - (now - oldest)

    # -- running payloads ---------------------------------------------------------------------

    def _dispatch(self) -> None:
        while self._ready and self._idle:
            payload = self._ready.popleft()
            payload.started = True
            if self._current is payload:
                self._current = None
            instance = self._idle.popleft()
            self._busy += 1
            instance.post(partial(self._run, instance, payload))

    def _run(self, instance: Instance, payload: _Payload) -> None:
        try:
            entries = payload.entries
            pendings = None
            if self._stack and len(entries) > 1:
                pendings = [
                    stacked_pending([e.pending for e in entries], [e.batch_size for e in entries])
                ]
            run_timed(self._run_batch, instance, entries, self._stats, pendings)
        except BaseException as exc:  # the instance goes on with the next payload
            fail_batch(instance.name, [e.pending for e in payload.entries], exc)
        finally:
            with self._cond:
                self._idle.append(instance)
                self._busy -= 1
                self._dispatch()
                self._cond.notify_all()

    # -- shutdown -----------------------------------------------------------------------------

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until no request is queued or executing. Returns False on timeout."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._busy == 0 and not self._ready and not len(self._queue),
                timeout=timeout,
            )

    def close(self, unavailable: str) -> None:
        """Stop the batcher thread; answer what is still waiting, and every later request,
        UNAVAILABLE `unavailable`."""
        with self._cond:
            self._unavailable = unavailable
            waiting = self._queue.take(len(self._queue))
            for payload in self._ready:
                waiting.extend(payload.entries)
            self._ready.clear()
            self._current = None
            self._cond.notify_all()
        for entry in waiting:
            entry.pending.fail(unavailable, pb_utils.TritonError.UNAVAILABLE)
        if self._thread.ident is not None:
            self._thread.join(timeout=5)
