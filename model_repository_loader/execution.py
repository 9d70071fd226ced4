"""Calling `execute` and holding the model to Triton's contract for what it returns.

`Pending` is one validated request on its way through a model: the `pb_utils.InferenceRequest` the
model sees, and the one path by which its responses leave (`deliver`), whether they come from the
list `execute` returns, from a response sender on any thread, or from an error. On the way out a
response is shaped (response_shape.py), stored on a cache miss (response_cache.py) and handed to
its caller's `respond`: nothing it passes through calls back into the layers above.

A default-mode `execute` may return None, or None in its list, for requests it answers through
their response sender (Triton >= 24.06): before or after returning, from any thread. A returned
response counts as the request's one response on its sender, so a sender that already sent
refuses it (and fails the batch, as in Triton) and a send after it is refused in the model.

`async def execute` coroutines run on the instance's own event loop (instance.py), for default and
decoupled models alike, and the instance thread is free for the next batch while they await.
Triton serializes default-mode coroutines; overlapping them is the point of writing one.

No exception on a request's way back may strand it or its instance: `deliver` closes a request
whose `respond` callback raised (with an INTERNAL error, if the callback still takes one) and
never raises into model code, and `run_execute` fails the open requests of a batch when routing
its result raises. The instance thread and the schedulers' loops carry the last guard.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

from . import pb_utils
from .errors import failed_requests_text, format_python_error
from .inference import Respond
from .response_shape import split_rows

if TYPE_CHECKING:  # instance.py runs batches through this module
    from .instance import ModelInstance
    from .response_cache import CacheFill
    from .response_shape import ResponseShape
    from .tracing import RequestTrace

log = logging.getLogger(__name__)

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
RESCHEDULE = pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE

# Triton's text when a model asks for RESCHEDULE without `sequence_batching { iterative_sequence }`
# [V]. Triton only logs it and leaves the request open; the bridge also closes the request with it.
RESCHEDULE_UNSUPPORTED = (
    "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not "
    "configured to handle such a flag."
)


# The text a request is closed with when its response could not be handed to the caller.
RESPOND_FAILED = "internal error while sending the response: "


class RequestStats(Protocol):
    """Where a request's outcome is counted (scheduling.stats.ModelStats)."""

    def record_request(
        self, ok: bool, batch_size: int, duration_ns: int, reason: str = "BACKEND"
    ) -> None: ...

    def queue_changed(self, delta: int) -> None: ...

    def record_first_response(self, duration_ns: int) -> None: ...


# Triton's failure reason for a request the server failed with this code; a model's own error
# response (a TritonError in an InferenceResponse) counts as a success, as in Triton [V on 2.51].
_FAILURE_REASONS = {
    pb_utils.TritonError.CANCELLED: "CANCELED",
    pb_utils.TritonError.UNAVAILABLE: "REJECTED",  # queue full, queue timeout
}


class Pending:
    """One request in flight: what the model sees and where its responses go.

    Built complete by whoever admits the request (the model version, a scheduler's stacked or
    padding request, an isolated instance's process); nothing sets its fields afterwards.

    `decoupled`: when not None, the request gets a response sender of that mode that delivers
    here, and its `is_cancelled()` reads this request's cancellation (None: the request keeps
    what it was built with; a sequence slot's padding has no sender).

    `shape` and `requested`: the model version's output filter and reshape, applied to every
    response on its way to `respond` (None: responses pass unchanged). `cache_fill`: where a
    request the response cache missed stores its shaped response.

    `requeue` is the scheduler's re-entry for request rescheduling: given when the model may
    release the request with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE; None means the model is
    not configured for it.

    `stats` is told the request's outcome when its final response leaves, however the model
    answers (returned list, response sender, error): success or failure, `batch_size`, and the
    time since `arrival_ns`. While `queued` (a request going to a scheduler) it counts in the
    stats' queue gauge, until `left_queue()` (its `execute` starts) or its final response,
    whichever comes first.

    `open_table` is the admitting version's table of open requests, keyed by id: the request
    leaves it when it is closed, and what is still there when the version closes is answered
    UNAVAILABLE.

    Built once per request on the caller's event loop, so it stays small: cancellation is a
    plain flag (one attribute write is atomic under the GIL) rather than a `threading.Event`,
    and the list of cancellation callbacks exists only once someone registers one.
    """

    __slots__ = (
        "request",
        "requeue",
        "stats",
        "batch_size",
        "arrival_ns",
        "queued",
        "_answered",
        "_respond",
        "_shape",
        "_requested",
        "_cache_fill",
        "_closed",
        "_lock",
        "_cancelled",
        "_cancel_callbacks",
        "open_table",
        "_executing",
        "_outcome",
        "trace",
    )

    def __init__(
        self,
        request: pb_utils.InferenceRequest,
        respond: Respond,
        *,
        decoupled: bool | None = None,
        shape: ResponseShape | None = None,
        requested: frozenset[str] = frozenset(),
        cache_fill: CacheFill | None = None,
        batch_size: int = 1,
        stats: RequestStats | None = None,
        queued: bool = False,
        requeue: Callable[[Pending], None] | None = None,
        open_table: dict[int, Pending] | None = None,
        trace: RequestTrace | None = None,
    ) -> None:
        self._respond = respond
        self._shape = shape
        self._requested = requested
        self._cache_fill = cache_fill
        self._closed = False
        self._lock = threading.Lock()
        self._cancelled = False
        self._cancel_callbacks: list[Callable[[], None]] | None = None
        self.requeue = requeue
        self.stats = stats
        self.open_table = open_table
        self.batch_size = batch_size
        self.arrival_ns = time.monotonic_ns()
        self.queued = queued
        self._answered = False
        # While its `execute` runs, a final response's outcome waits here to be counted when
        # the call ends (`executed`), so that the request's duration covers its execution.
        self._executing = False
        self._outcome: str | None = None
        self.trace = trace  # set for a traced request (tracing.py)
        if decoupled is not None:
            # The request's way back is this request: a cycle (request → sender → here) that
            # the default scheduler breaks with `drop_request` once the request is answered.
            request._response_sender = pb_utils.InferenceResponseSender(
                self.deliver, decoupled=decoupled, is_cancelled=self.is_cancelled
            )
            request._is_cancelled = self.is_cancelled
        self.request = request

    @property
    def closed(self) -> bool:
        return self._closed

    def is_cancelled(self) -> bool:
        return self._cancelled

    def drop_request(self) -> None:
        """Let go of the model's request once it is answered and nothing reads it any more.

        Breaks the cycle request → response sender → this, so the request is freed by
        reference counting instead of waiting for the cyclic collector.
        """
        self.request = None  # type: ignore[assignment]

    def cancel(self) -> None:
        """The caller gave up (client cancel, deadline, disconnect).

        From now on `request.is_cancelled()` and `sender.is_cancelled()` are true; sends still
        succeed (as in Triton) and the caller is free to drop what arrives. Callbacks given to
        `on_cancel` run here, once, on the caller's thread.
        """
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            callbacks, self._cancel_callbacks = self._cancel_callbacks, None
        for callback in callbacks or ():
            try:
                callback()
            except Exception:  # one listener's failure must not stop the others
                log.exception("a cancellation callback failed")

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Call `callback()` when the request is cancelled (at once if it already is)."""
        with self._lock:
            if not self._cancelled:
                if self._cancel_callbacks is None:
                    self._cancel_callbacks = []
                self._cancel_callbacks.append(callback)
                return
        callback()

    def left_queue(self) -> None:
        """The request leaves the scheduler's queue (its `execute` starts, or it is answered)."""
        with self._lock:
            if not self.queued:
                return
            self.queued = False
        if self.stats is not None:
            self.stats.queue_changed(-1)

    def deliver(
        self,
        response: pb_utils.InferenceResponse | None,
        final: bool,
        failure: str | None = None,
    ) -> bool:
        """Send one response to the caller; False if the request was already closed.

        `failure` (a Triton failure reason) marks a request the server failed, not the model.
        Never raises: if finishing or handing over the response fails, the request is closed
        with an INTERNAL error instead (see `_respond_failed`), and the model goes on.
        """
        with self._lock:
            if self._closed:
                return False
            self._closed = final
            first, self._answered = not self._answered, True
            deferred = final and self._executing
            if final:
                # Nothing is left to cancel; this also breaks the cycle a scheduler's cancel
                # callback makes back to this request.
                self._cancel_callbacks = None
                if deferred:
                    self._outcome = failure or ""
        if final and self.open_table is not None:
            self.open_table.pop(id(self), None)
        if first and self.stats is not None:
            self.stats.record_first_response(time.monotonic_ns() - self.arrival_ns)
        if final and self.stats is not None:
            self.left_queue()
            if not deferred:
                self._record(failure)
        if self.trace is not None:
            self.trace.responded(response)
            if final and not deferred:
                self.trace.end()
        try:
            if self._shape is not None:
                response = self._shape.apply(response, self._requested)
            if self._cache_fill is not None:
                self._cache_fill.store(response)
            self._respond(response, final)
        except BaseException as exc:  # the caller's callback must not stop the instance
            self._respond_failed(exc, final)
        return True

    def executing(self) -> None:
        """Its `execute` call starts: a final response sent during it is counted at its end."""
        self._executing = True

    def executed(self) -> None:
        """Its `execute` call ended: count the outcome of a final response sent during it.

        Triton's request duration ends when the backend releases the request, after `execute`
        returned, so it covers queue + compute input + infer + output [V on 2.51].
        """
        with self._lock:
            self._executing = False
            outcome, self._outcome = self._outcome, None
        if outcome is not None and self.stats is not None:
            self._record(outcome or None)
        if self.trace is not None and self._closed:
            self.trace.end()

    def _record(self, failure: str | None) -> None:
        assert self.stats is not None
        self.stats.record_request(
            failure is None,
            self.batch_size,
            time.monotonic_ns() - self.arrival_ns,
            failure or "BACKEND",
        )

    def _respond_failed(self, exc: BaseException, was_final: bool) -> None:
        with self._lock:
            self._closed = True
            self._cancel_callbacks = None
        if self.open_table is not None:
            self.open_table.pop(id(self), None)
        if not was_final and self.stats is not None:
            self.left_queue()
            self.stats.record_request(
                False, self.batch_size, time.monotonic_ns() - self.arrival_ns, "OTHER"
            )
        answer_failure(self._respond, exc)

    def fail(self, message: str, code: Any = None) -> None:
        code = code if code is not None else pb_utils.TritonError.INTERNAL
        error = pb_utils.TritonError(message, code)
        self.deliver(
            pb_utils.InferenceResponse(error=error), True, _FAILURE_REASONS.get(code, "BACKEND")
        )

    def fail_cancelled(self) -> None:
        """Close a request cancelled before it reached `execute`, as Triton's schedulers do.

        Triton answers it with a bare CANCELLED status (no message) and never executes it; a
        gRPC client sees its own "Locally cancelled by application!" instead.
        """
        self.fail("", pb_utils.TritonError.CANCELLED)


def answer_failure(respond: Respond, exc: BaseException) -> None:
    """`respond` raised `exc` instead of taking a response: answer the request with an INTERNAL
    error if `respond` still takes one (a small error often goes where a large response could
    not), and log it once. Never raises.

    A respond call that raised did not take its response, final or not, so the request is still
    unanswered: this is its last answer.
    """
    message = f"{RESPOND_FAILED}{type(exc).__name__}: {exc}"
    log.error("%s; closing the request with an INTERNAL error", message, exc_info=exc)
    error = pb_utils.TritonError(message, pb_utils.TritonError.INTERNAL)
    try:
        respond(pb_utils.InferenceResponse(error=error), True)
    except BaseException as again:
        log.warning("the error could not be answered either: %r", again)


def discard(response: pb_utils.InferenceResponse | None, final: bool) -> None:
    """The `respond` of a request nobody waits for (a sequence slot's padding)."""


class StackedParts:
    """The `respond` of a stacked request (scheduling/stacking.py): each part gets its rows of
    the response, or the error, straight from here."""

    __slots__ = ("_parts", "_sizes", "_what")

    def __init__(self, parts: Sequence[Pending], sizes: Sequence[int], what: str) -> None:
        self._parts = list(parts)
        self._sizes = list(sizes)
        self._what = what  # the stacking option, named in the error of an unsplittable output

    def __call__(self, response: pb_utils.InferenceResponse | None, final: bool) -> None:
        if response is None or response.has_error():
            for part in self._parts:
                part.deliver(response, final)
            return
        try:
            split = split_rows(response, self._sizes, self._what)
        except ValueError as exc:
            error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INTERNAL)
            for part in self._parts:
                part.deliver(pb_utils.InferenceResponse(error=error), True)
            return
        for part, part_response in zip(self._parts, split, strict=True):
            part.deliver(part_response, final)


# The span of the last `execute` call made on this thread (see `take_compute_span`).
_compute = threading.local()


def take_compute_span() -> tuple[int, int] | None:
    """(start, end) in monotonic ns of the model's last `execute` call on this thread, once.

    A scheduler reads it after running a batch to split the call's time as Triton does:
    compute input (up to `execute`), compute infer (`execute` itself), compute output (routing
    what it returned). None where `execute` did not run on this thread (an isolated instance,
    a batch dropped before it) or raised.
    """
    span = getattr(_compute, "span", None)
    _compute.span = None
    return span


def run_execute(instance: ModelInstance, batch: list[Pending], decoupled: bool) -> None:
    """Run `execute` for one batch on the instance thread and route what comes back.

    Never raises: whatever fails on the way (the model, the checks, the routing) fails the
    batch's open requests, so the instance goes on serving.
    """
    try:
        _execute(instance, batch, decoupled)
    except BaseException as exc:
        fail_batch(instance.name, batch, exc)


def fail_batch(instance_name: str, batch: list[Pending], exc: BaseException) -> None:
    """The last guard of a batch: log `exc` once and fail the requests not yet closed."""
    message = failed_requests_text(instance_name, f"{INTERNAL_FAILURE}{type(exc).__name__}: {exc}")
    log.error("%s", message, exc_info=exc)
    for pending in batch:
        pending.fail(message)


# What a batch's requests are closed with when something outside the model's code failed.
INTERNAL_FAILURE = "internal error: "


def _execute(instance: ModelInstance, batch: list[Pending], decoupled: bool) -> None:
    for pending in batch:
        if pending.is_cancelled() or pending.closed:
            batch = _drop_cancelled(batch)
            if not batch:
                return
            break
    execute = getattr(instance.model, "execute", None)
    if execute is None:
        _fail_open(
            batch,
            _failure_prefix(instance)
            + f"Python model {instance.spec.model_file} does not implement `execute` method.",
        )
        return
    try:
        with pb_utils.context.phase("execute"):
            requests = [p.request for p in batch]
            started = time.monotonic_ns()
            result = execute(requests)
            _compute.span = (started, time.monotonic_ns())
            if type(result) is not list and inspect.iscoroutine(result):
                # Submitted inside the phase: the coroutine's task copies this context.
                instance.run_coroutine(
                    result, lambda outcome: _coroutine_done(instance, batch, decoupled, outcome)
                )
                return
    except BaseException as exc:  # the model's failure goes to its callers, never up
        message = _failure_prefix(instance) + format_python_error(exc)
        log.error("%s", message)
        _fail_open(batch, message)
        return
    _route_result(instance, batch, decoupled, result)


def _failure_prefix(instance: ModelInstance) -> str:
    # Built only when something failed: run_execute is on every request's path.
    return failed_requests_text(instance.name, "")


def _drop_cancelled(batch: list[Pending]) -> list[Pending]:
    """Requests cancelled while they waited never reach execute (Triton's scheduler check), nor
    do requests already closed (answered UNAVAILABLE by a closing model)."""
    live = []
    for pending in batch:
        if pending.closed:
            continue
        if pending.is_cancelled():
            pending.fail_cancelled()
        else:
            live.append(pending)
    return live


def _coroutine_done(
    instance: ModelInstance, batch: list[Pending], decoupled: bool, outcome: Future[Any]
) -> None:
    """Route what an `async def execute` coroutine returned (runs on the instance's loop)."""
    exc = outcome.exception()
    if exc is None:
        try:
            _route_result(instance, batch, decoupled, outcome.result())
        except BaseException as routing_failure:
            fail_batch(instance.name, batch, routing_failure)
        return
    message = _failure_prefix(instance) + format_python_error(exc)
    if decoupled:
        # Triton logs the traceback and sends nothing, leaving every open request hanging; the
        # bridge also closes them with the error so that clients are not left waiting.
        log.error("%s", "".join(traceback.format_exception(exc)).rstrip())
    else:
        log.error("%s", message)
    _fail_open(batch, message)


def _route_result(
    instance: ModelInstance, batch: list[Pending], decoupled: bool, result: Any
) -> None:
    if decoupled:
        if result is not None:
            _fail_open(
                batch,
                _failure_prefix(instance)
                + f"Python model '{instance.name}' is using the decoupled mode and the execute "
                "function must return None.",
            )
            return
        _release(instance, batch)
        return

    if result is None:
        # Every request is answered (or will be, from any thread) through its response sender.
        _release(instance, batch)
        return
    problem = _check_returned_list(result, batch) or _claim_returned(result, batch)
    if problem is not None:
        # Triton sends none of the returned responses then: every request not yet closed
        # (also one whose returned response was fine) gets the error [V on 2.51].
        message = _failure_prefix(instance) + problem
        log.error("%s", message)
        _fail_open(batch, message)
        return
    for pending, response in zip(batch, result, strict=True):
        if response is not None:
            pending.deliver(response, True)
    _release(instance, batch)


def _claim_returned(result: list[Any], batch: list[Pending]) -> str | None:
    """Count each returned response as its request's one response on the request's sender, as
    Triton does before sending any of them; the first refusal (the sender already sent a
    response) is the batch's error. Claims made before it stand: those senders stay closed, and
    their requests get the error instead (what Triton answers).
    """
    for pending, response in zip(batch, result, strict=True):
        if response is None:
            continue  # answered, or to be answered, through the response sender
        sender = pending.request._response_sender
        if sender is None:
            continue
        problem = sender._claim_returned()
        if problem is not None:
            return problem
    return None


def _release(instance: ModelInstance, batch: list[Pending]) -> None:
    """Put requests the model released with RESCHEDULE back through their scheduler."""
    for pending in batch:
        request = pending.request
        if not request._release_flags & RESCHEDULE:
            continue
        request._release_flags = pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL
        if pending.closed:
            continue  # nothing left to answer
        if pending.requeue is None:
            log.error("%s: Failed to release request: %s", instance.name, RESCHEDULE_UNSUPPORTED)
            pending.fail(RESCHEDULE_UNSUPPORTED)
            continue
        pending.requeue(pending)


def _check_returned_list(result: Any, batch: list[Pending]) -> str | None:
    expected = len(batch)
    if not isinstance(result, list):
        return f"Expected a list in the execute return, found type '{type(result)}'."
    if len(result) != expected:
        return (
            "Number of InferenceResponse objects do not match the number of InferenceRequest "
            f"objects. InferenceRequest(s) size is:{expected}, and InferenceResponse(s) size "
            f"is:{len(result)}\n"
        )
    for pending, response in zip(batch, result, strict=True):
        if response is None:
            continue
        if pending.request._release_flags & RESCHEDULE:
            # A rescheduled request is answered later; "reschduled" is Triton's spelling [S].
            return (
                "Expected a None object in the execute function return list for reschduled "
                f"request, found type '{type(response)}'."
            )
        if not isinstance(response, pb_utils.InferenceResponse):
            return (
                "Expected an 'InferenceResponse' object in the execute function return list, "
                f"found type '{type(response)}'."
            )
    return None


def _fail_open(batch: list[Pending], message: str) -> None:
    for pending in batch:
        pending.fail(message)
