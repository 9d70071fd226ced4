"""Triton's sequence batcher (`sequence_batching`, direct and oldest strategies).

Every instance has `max(1, max_batch_size)` sequence slots. A sequence (correlation id) gets a
slot on its START request and keeps it until its END request is scheduled or it has been idle
for `max_sequence_idle_microseconds`; all its requests run on that slot's instance, in order.
Free slots are handed out lowest slot index first, ties as Triton's heap breaks them
(slots.py), so the first sequences spread over the instances [V]. A new sequence that finds
no free slot waits in a backlog [V].

An instance's `execute` gets the next request of each of its slots that has one. With the direct
strategy a batching model also gets, like in Triton, a padding request (READY false) for every
empty slot below the highest busy one [V: a lone request in slot 1 arrived as a batch of 2];
the oldest strategy sends only real requests.

Requests are checked as Triton does (texts [V]): a correlation id is required, batch size 1,
and a sequence that is not running must begin with START.

A request cancelled while it waits on its slot or in the backlog leaves at once and is answered
CANCELLED. A batch whose run raised fails its requests and the instance goes on. Once closed, the
batcher answers what it still holds, and every later request, UNAVAILABLE.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from .. import pb_utils
from ..execution import Pending, discard, fail_batch
from ..instance import Instance
from .controls import Controls
from .entry import Entry, RunBatch, drop_if_cancelled, run_timed
from .slots import FreeSlots
from .stats import ModelStats

log = logging.getLogger(__name__)

_START = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
_END = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END


class _Instance:
    __slots__ = ("instance", "index", "slots", "owners", "busy")

    def __init__(self, instance: Instance, index: int, slots: int) -> None:
        self.instance = instance
        self.index = index
        self.slots: list[deque[Entry]] = [deque() for _ in range(slots)]
        self.owners: list[int | str | None] = [None] * slots
        self.busy = False


class SequenceBatcher:
    def __init__(
        self,
        config: mc.ModelConfig,
        instances: Sequence[Instance],
        run_batch: RunBatch,
        stats: ModelStats,
    ) -> None:
        batching = config.sequence_batching
        self._model = config.name
        self._batching = config.max_batch_size > 0
        self._direct = not batching.HasField("oldest")
        self._iterative = batching.iterative_sequence
        # Triton's IterativeSequencer numbers the sequences it starts itself from 1 [S].
        self._own_sequence_ids = itertools.count(1)
        self._in_flight: dict[int, Entry] = {}  # id(pending) -> entry, while executing
        self._idle_ns = batching.max_sequence_idle_microseconds * 1000
        self._controls = Controls(batching, self._batching)
        self._run_batch = run_batch
        self._stats = stats
        # Direct: one slot per batch row. Oldest: `max_candidate_sequences` candidates, of which
        # the oldest requests fill a batch of at most max_batch_size.
        slots = max(1, config.max_batch_size)
        if not self._direct:
            slots = max(1, batching.oldest.max_candidate_sequences or slots)
        self._batch_limit = max(1, config.max_batch_size)
        self._instances = [_Instance(inst, i, slots) for i, inst in enumerate(instances)]
        self._free = FreeSlots(len(instances), slots)
        # correlation id -> (instance index, slot); and when the sequence last saw a request.
        self._active: dict[int | str, tuple[int, int]] = {}
        self._last_seen: dict[int | str, int] = {}
        self._backlog: OrderedDict[int | str, deque[Entry]] = OrderedDict()
        self._busy = 0
        self._unavailable: str | None = None  # set by close(): the answer to late requests
        self._cond = threading.Condition()
        # Started with the first request, so a version that never serves leaves no thread.
        self._reaper = threading.Thread(
            target=self._reap_forever, name=f"sequences:{config.name}", daemon=True
        )

    # -- the way in ---------------------------------------------------------------------------

    def enqueue(self, pending: Pending, priority: int = 0) -> None:
        request = pending.request
        corrid = request.correlation_id()
        if (corrid == 0 or corrid == "") and self._iterative:
            self._start_own_sequence(request)
        elif corrid == 0 or corrid == "":
            pending.fail(
                f"inference request to model '{self._model}' must specify a non-zero or "
                "non-empty correlation ID",
                pb_utils.TritonError.INVALID_ARG,
            )
            return
        if pending.batch_size > 1:
            pending.fail(
                f"inference request to model '{self._model}' must specify batch-size 1 due to "
                "requirements of sequence batcher",
                pb_utils.TritonError.INVALID_ARG,
            )
            return
        entry = Entry(pending, priority=priority)
        with self._cond:
            refused = self._unavailable
            if refused is None:
                if self._reaper.ident is None:
                    self._reaper.start()
                self._route(entry)
                self._cond.notify_all()
        if refused is not None:
            pending.fail(refused, pb_utils.TritonError.UNAVAILABLE)
        elif not pending.closed:
            # Registered outside the lock: it runs at once if the request is already cancelled.
            pending.on_cancel(lambda: self._cancelled(entry))

    def _start_own_sequence(self, request: pb_utils.InferenceRequest) -> None:
        """An iterative model's request outside any sequence starts one of its own, as Triton's
        IterativeSequencer does [S]: a new correlation ID (the model sees it) and the START flag
        only. Triton's counter may hand out an ID a client is using; here one in use is skipped.
        """
        with self._cond:
            corrid = next(self._own_sequence_ids)
            while corrid in self._active or corrid in self._backlog:
                corrid = next(self._own_sequence_ids)
        request._correlation_id = corrid
        request._flags = _START

    def _cancelled(self, entry: Entry) -> None:
        """A waiting request was cancelled: off its slot or the backlog, answered now."""
        with self._cond:
            if not self._unqueue(entry):
                return  # running, done, or rescheduled: run_execute and _schedule see it
            self._cond.notify_all()
        entry.pending.fail_cancelled()

    def _unqueue(self, entry: Entry) -> bool:
        if entry.rescheduled:
            return False  # its iterative sequence holds the slot until the run ends
        corrid = entry.pending.request.correlation_id()
        place = self._active.get(corrid)
        waiting: deque[Entry] | None
        if place is not None:
            waiting = self._instances[place[0]].slots[place[1]]
        else:
            waiting = self._backlog.get(corrid)
            if waiting is None:
                return False
        try:
            waiting.remove(entry)
        except ValueError:
            return False
        if place is None and not waiting:
            del self._backlog[corrid]  # nothing of this sequence waits any more
        return True

    def _route(self, entry: Entry) -> None:
        """Queue the request on its sequence's slot, start a sequence, or refuse it."""
        pending = entry.pending
        request = pending.request
        corrid = request.correlation_id()
        self._last_seen[corrid] = entry.arrival_ns
        place = self._active.get(corrid)
        if place is not None:
            self._instances[place[0]].slots[place[1]].append(entry)
            self._schedule(self._instances[place[0]])
        elif corrid in self._backlog:
            self._backlog[corrid].append(entry)
        elif not request.flags() & _START:
            self._last_seen.pop(corrid, None)
            pending.fail(
                f"inference request for sequence {corrid} to model '{self._model}' must "
                "specify the START flag on the first request of the sequence",
                pb_utils.TritonError.INVALID_ARG,
            )
        elif self._free:
            self._assign(corrid, deque([entry]))
        else:
            self._backlog[corrid] = deque([entry])

    # -- slots --------------------------------------------------------------------------------

    def _assign(self, corrid: int | str, entries: deque[Entry]) -> None:
        index, slot = self._free.pop()
        holder = self._instances[index]
        holder.owners[slot] = corrid
        holder.slots[slot].extend(entries)
        self._active[corrid] = (index, slot)
        self._schedule(holder)

    def _release(self, corrid: int | str) -> None:
        index, slot = self._active.pop(corrid)
        self._last_seen.pop(corrid, None)
        holder = self._instances[index]
        holder.owners[slot] = None
        # Requests of this id that came after its END are no longer part of the sequence: a
        # START begins a new one, anything else is refused, as for any unknown sequence.
        leftovers = list(holder.slots[slot])
        holder.slots[slot].clear()
        self._free.push((index, slot))
        if self._backlog:
            waiting, entries = self._backlog.popitem(last=False)
            self._last_seen[waiting] = time.monotonic_ns()
            self._assign(waiting, entries)
        for entry in leftovers:
            self._route(entry)

    # -- running ------------------------------------------------------------------------------

    def _schedule(self, holder: _Instance) -> None:
        """Start the instance on its slots' next requests, if it is free and has any."""
        if holder.busy:
            return
        candidates: list[int] = []
        for slot, queue in enumerate(holder.slots):
            while queue and drop_if_cancelled(queue[0]):
                queue.popleft()
            if queue:
                candidates.append(slot)
        if not candidates:
            return
        if not self._direct:
            candidates.sort(key=lambda slot: holder.slots[slot][0].arrival_ns)
            candidates = candidates[: self._batch_limit]
        heads = [(slot, holder.slots[slot].popleft()) for slot in candidates]
        ended = [
            entry.pending.request.correlation_id()
            for _, entry in heads
            # An iterative sequence keeps its slot while its request is rescheduled.
            if entry.pending.request.flags() & _END and not self._iterative
        ]
        try:
            pendings = self._prepare(heads)
        except BaseException as exc:  # these requests are off their slots: answer them here
            fail_batch(holder.instance.name, [entry.pending for _, entry in heads], exc)
            for corrid in ended:
                if self._active.get(corrid) is not None:
                    self._release(corrid)
            self._schedule(holder)  # each failed round consumed requests, so this ends
            return
        holder.busy = True
        self._busy += 1
        for corrid in ended:
            if self._active.get(corrid) is not None:
                self._release(corrid)
        entries = [entry for _, entry in heads]
        holder.instance.post(lambda: self._run(holder, entries, pendings))

    def _prepare(self, heads: list[tuple[int, Entry]]) -> list:
        """The batch `execute` gets for `heads`: control inputs added, padding if direct."""
        for _slot, entry in heads:
            request = entry.pending.request
            if entry.base_inputs is None:
                entry.base_inputs = list(request._inputs)
            entry.rescheduled = False
            request._inputs = entry.base_inputs + self._controls.tensors(
                request.correlation_id(), request.flags(), ready=True
            )
        pendings: list = [entry.pending for _, entry in heads]
        if self._direct and self._batching:
            pendings = self._pad(heads)
        for _slot, entry in heads:
            self._in_flight[id(entry.pending)] = entry
        return pendings

    def _pad(self, heads: list[tuple[int, Entry]]) -> list:
        """The direct strategy's batch: one request per slot up to the highest busy one."""
        by_slot = dict(heads)
        template = heads[0][1].pending.request
        batch: list = []
        for slot in range(max(by_slot) + 1):
            entry = by_slot.get(slot)
            batch.append(entry.pending if entry is not None else self._null(template))
        return batch

    def _null(self, template: pb_utils.InferenceRequest) -> Pending:
        names = {c.name() for c in self._controls.tensors(0, 0, ready=False)}
        inputs = [
            pb_utils.Tensor._from_wire(t.name(), np.zeros_like(t._array), t._datatype)
            for t in template._inputs
            if t.name() not in names
        ]
        inputs += self._controls.tensors(0, 0, ready=False)
        request = pb_utils.InferenceRequest._incoming(
            inputs=inputs,
            requested_output_names=template.requested_output_names(),
            response_sender=None,
        )
        # Padding for an empty direct slot: the model sees it; its responses go nowhere.
        return Pending(request, discard)

    def _run(self, holder: _Instance, entries: list[Entry], pendings: list) -> None:
        try:
            run_timed(self._run_batch, holder.instance, entries, self._stats, pendings)
        except BaseException as exc:  # the instance goes on with its slots' next requests
            fail_batch(holder.instance.name, [e.pending for e in entries], exc)
        finally:
            with self._cond:
                now = time.monotonic_ns()
                for entry in entries:
                    self._in_flight.pop(id(entry.pending), None)
                    request = entry.pending.request
                    corrid = request.correlation_id()
                    # Triton ends an iterative sequence when its request is done for good,
                    # END flag or not: the next request needs START again [V].
                    if self._iterative and not entry.rescheduled and corrid in self._active:
                        self._release(corrid)
                for owner in holder.owners:
                    if owner is not None:
                        self._last_seen[owner] = max(self._last_seen.get(owner, 0), now)
                holder.busy = False
                self._busy -= 1
                self._schedule(holder)
                self._cond.notify_all()

    def reschedule(self, pending: Pending) -> None:
        """Request rescheduling (`iterative_sequence`): the request runs again next, on its
        sequence's slot."""
        with self._cond:
            entry = self._in_flight.get(id(pending))
            place = self._active.get(pending.request.correlation_id())
            if entry is None or place is None:
                pending.fail("the rescheduled request's sequence is no longer active")
                return
            entry.rescheduled = True
            # Only the first run carries START: Triton reports flags 0 afterwards [V].
            pending.request._flags &= ~_START
            self._instances[place[0]].slots[place[1]].appendleft(entry)

    # -- idle sequences -----------------------------------------------------------------------

    def _reap_forever(self) -> None:
        with self._cond:
            while self._unavailable is None:
                now = time.monotonic_ns()
                deadline = None
                for corrid in list(self._active):
                    index, slot = self._active[corrid]
                    holder = self._instances[index]
                    if holder.slots[slot] or holder.busy:
                        continue  # work is queued or running: not idle
                    expires = self._last_seen.get(corrid, now) + self._idle_ns
                    if expires <= now:
                        log.info("%s: sequence %s idle, released", self._model, corrid)
                        self._release(corrid)
                    elif deadline is None or expires < deadline:
                        deadline = expires
                timeout = None if deadline is None else max(0.001, (deadline - now) / 1e9)
                self._cond.wait(timeout)

    # -- shutdown -----------------------------------------------------------------------------

    def drain(self, timeout: float | None = None) -> bool:
        with self._cond:
            return self._cond.wait_for(
                lambda: (
                    self._busy == 0
                    and not any(q for h in self._instances for q in h.slots)
                    and not self._backlog
                ),
                timeout=timeout,
            )

    def close(self, unavailable: str) -> None:
        """Stop the reaper; answer what still waits on a slot or in the backlog, and every later
        request, UNAVAILABLE `unavailable`."""
        with self._cond:
            self._unavailable = unavailable
            waiting = [e for holder in self._instances for q in holder.slots for e in q]
            waiting += [e for q in self._backlog.values() for e in q]
            for holder in self._instances:
                for queue in holder.slots:
                    queue.clear()
            self._backlog.clear()
            self._cond.notify_all()
        for entry in waiting:
            entry.pending.fail(unavailable, pb_utils.TritonError.UNAVAILABLE)
        if self._reaper.ident is not None:
            self._reaper.join(timeout=5)
