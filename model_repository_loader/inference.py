"""The loader's own request and response vocabulary.

A caller (the Dynamo bridge, a BLS call, a test) hands a model an `InferRequest` built from
`pb_utils.Tensor` objects, plus a `Respond` callback. The model validates, schedules and executes
the request, and reports every response through the callback, from whatever thread produced it.
Using the pb_utils types end to end means a tensor crosses no extra conversion between the
transport, the model and BLS.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from .pb_utils import InferenceResponse, Tensor
from .tracing import RequestTrace

ParameterValue = bool | int | float | str

# Request parameters Triton consumes itself (its src/common.h kReservedParameterKeys); the model
# never sees them in `parameters()`.
TRITON_PARAMETERS = frozenset(
    {
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "priority",
        "timeout",
        "headers",
        "binary_data_output",
    }
)

# respond(response, final): `response` is None only for a flag-only final (no data);
# `final` is True on the last call for a request. Called from any thread, never concurrently
# for the same request. A caller may make it wait (backpressure: its client is behind), but
# only while `respond_may_wait()` says so.
Respond = Callable[[InferenceResponse | None, bool], None]

_thread_state = threading.local()


def respond_may_wait() -> bool:
    """Whether a `Respond` called on this thread now may block it until its caller catches up.

    False inside `holding_a_shared_lock()`: a thread that holds a lock other requests' answers
    pass through (preserve_ordering's gate) must not wait on one client, or the thread that
    would let it go (a caller answering a cancelled request through the same gate) waits for
    the lock, and neither moves.
    """
    return not getattr(_thread_state, "shared_lock", False)


@contextlib.contextmanager
def holding_a_shared_lock() -> Iterator[None]:
    """Mark this thread's `Respond` calls as ones that must not wait (`respond_may_wait`)."""
    outer = getattr(_thread_state, "shared_lock", False)
    _thread_state.shared_lock = True
    try:
        yield
    finally:
        _thread_state.shared_lock = outer


@dataclass(slots=True)
class InferRequest:
    """One inference request as a client sent it, before validation."""

    inputs: list[Tensor]
    # Names of the outputs the client asked for; empty means every output in the config.
    requested_outputs: list[str] = field(default_factory=list)
    request_id: str = ""
    # Every request parameter as sent, reserved ones (sequence_id, timeout, priority,
    # triton_*) included: the model splits them into correlation id, flags and custom ones.
    parameters: dict[str, ParameterValue] = field(default_factory=dict)
    # -1: the highest version being served.
    model_version: int = -1
    # Set only for a request to trace (tracing.py); None costs nothing on the way.
    trace: RequestTrace | None = None


def answer_of(
    submit: Callable[[InferRequest, Respond], object],
    request: InferRequest,
    timeout: float | None,
    what: str,
) -> InferenceResponse:
    """Submit `request` and wait for its last response (`what` names the model in the error).

    In-process callers (tests, scripts) use this through `Model.infer` / `EnsembleModel.infer`.
    """
    done = threading.Event()
    responses: list[InferenceResponse] = []

    def respond(response: InferenceResponse | None, final: bool) -> None:
        if response is not None:
            responses.append(response)
        if final:
            done.set()

    submit(request, respond)
    if not done.wait(timeout):
        raise TimeoutError(f"{what} did not answer within {timeout}s")
    return responses[-1] if responses else InferenceResponse([])
