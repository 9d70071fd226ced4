"""`InferenceResponseSender`: how a model sends responses for one request itself.

Decoupled models send any number of responses and close with TRITONSERVER_RESPONSE_COMPLETE_FINAL;
default-mode models may send exactly one response (then, optionally, a flag-only FINAL). A
response a default-mode `execute` returns counts as that one response (`_claim_returned`). Every
check and message follows Triton's ResponseSender [S][V]. Responses go to the loader's
`deliver(response, final)` callback, called under the sender's lock so that calls for one request
never overlap and arrive in order.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable
from typing import Any

from .errors import TritonModelException, pybind_type_error
from .response import InferenceResponse

# deliver(response, final): response is None only for a flag-only FINAL.
Deliver = Callable[[InferenceResponse | None, bool], Any]

_FINAL = 1
_SIGNATURE = (
    "(self: c_python_backend_utils.InferenceResponseSender, response: "
    "c_python_backend_utils.InferenceResponse = None, flags: int = 0) -> None"
)


def _never_cancelled() -> bool:
    return False


class InferenceResponseSender:
    """Built by the loader, one per request; the model gets it from `get_response_sender()`."""

    __slots__ = ("_deliver", "_decoupled", "_is_cancelled", "_lock", "_closed", "_sent")

    def __init__(
        self,
        deliver: Deliver,
        *,
        decoupled: bool,
        is_cancelled: Callable[[], bool] | threading.Event | None = None,
    ) -> None:
        self._deliver = deliver
        self._decoupled = decoupled
        if is_cancelled is None:
            is_cancelled = _never_cancelled
        elif isinstance(is_cancelled, threading.Event):
            is_cancelled = is_cancelled.is_set
        self._is_cancelled = is_cancelled
        self._lock = threading.Lock()
        self._closed = False
        self._sent = 0

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if (response is not None and not isinstance(response, InferenceResponse)) or (
            flags not in (0, 1) and not _is_uint32(flags)
        ):
            raise pybind_type_error("send", _SIGNATURE, (self, response, flags), {})
        if flags != _FINAL and flags != 0:
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        final = flags == _FINAL
        with self._lock:
            problem = self._refusal(response is not None, final)
            if problem is not None:
                raise TritonModelException(problem)
            if final:
                self._closed = True
            self._sent += 1
            try:
                self._deliver(response, final)
            except TritonModelException:
                raise
            except Exception as exc:
                raise TritonModelException(
                    str(exc) or "An error occurred while sending a response."
                ) from exc

    def _refusal(self, has_response: bool, final: bool) -> str | None:
        """Why a send is refused (Triton's text), or None; called under the lock."""
        if not self._decoupled:
            if has_response and self._sent > 0:
                return (
                    "Unable to send response. Non-decoupled model cannot send more than one "
                    "response."
                )
            if not has_response and final and self._sent == 0:
                return (
                    "Unable to send response. Non-decoupled model cannot send complete final "
                    "before sending a response."
                )
        if self._closed:
            return "Unable to send response. Response sender has been closed."
        return None

    def _claim_returned(self) -> str | None:
        """A default-mode `execute` returned a response for this request: count it as the
        request's one response, sent with FINAL, as Triton does before it sends any returned
        response. Returns the refusal text (the sender already sent), or None; the loader
        delivers the response itself once every returned response of the batch is claimed.
        """
        with self._lock:
            problem = self._refusal(True, True)
            if problem is None:
                self._closed = True
                self._sent += 1
            return problem

    def is_cancelled(self) -> bool:
        return bool(self._is_cancelled())

    @property
    def _is_closed(self) -> bool:
        """True once a FINAL was sent (for the loader)."""
        return self._closed

    @property
    def _responses_sent(self) -> int:
        """How many `send` calls went through (for the loader)."""
        return self._sent


def _is_uint32(value: Any) -> bool:
    if isinstance(value, float):
        return False
    try:
        return 0 <= operator.index(value) < (1 << 32)
    except TypeError:
        return False
