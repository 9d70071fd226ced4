"""BLS: `pb_utils.InferenceRequest(...).exec()` / `async_exec()` into models of this process.

`BlsExecutor(scope)` is a repository's `ModelServices.bls` (pb_utils/services.py). It looks the
target up by name in the scope's `models` at call time (hot reload swaps entries of that dict in
place) and hands the request
straight to `Model.submit`: no transport, and the caller's `pb_utils.Tensor` objects (numpy
arrays included) are the callee's inputs, without a copy.

As in Triton 2.51, failures come back inside the response, never raised [V]:
- the target's request checks (names, datatypes, shapes, outputs) and an unknown model or
  version carry the prefix `Model <name> - Error when running inference: `;
- errors the callee itself produces (an exception in `execute`, a TritonError response) arrive
  as the callee wrote them;
- the code is always INTERNAL (Triton HEAD keeps the callee's code; 2.51 does not) [V].

`exec()` waits without a bound, as Triton's does, since a slow callee is not a failed one. Every
wait has an end that answers: the callee answers (or fails) its request; a callee that closes
answers what it still holds UNAVAILABLE (model.py), and refuses new calls at once; an exception
on the way in (submitting, or running the call on a lent thread) answers the call INTERNAL.

A name that is not loaded here goes to the models other processes serve, when the scope has a
`RemoteModels` (remote.py): the same texts and codes, the same parameters and
`timeout`, decoupled iteration, and `ResponseIterator.cancel()` cancels the remote request. A
remote call is never lent a thread (waits.py): a cycle of synchronous calls across processes
(A calls B, which calls A's only instance back) waits forever, as it does in Triton.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from .. import pb_utils
from ..execution import run_execute
from ..inference import InferRequest
from .remote import RemoteModels
from .scope import Scope
from .tensors import handed_over, response_handed_over
from .waits import BlockedCall, calling_instance

log = logging.getLogger(__name__)

# The code of every BLS error response in Triton 2.51 [V] (HEAD: the callee's own code).
BLS_ERROR_CODE = pb_utils.TritonError.INTERNAL


def error_prefix(model_name: str) -> str:
    return f"Model {model_name} - Error when running inference: "


def not_ready_text(model_name: str) -> str:
    """Triton 2.51's reason for an unknown model or version (HEAD: "Request for unknown...") [V].

    A model no process serves (here, or through the installed RemoteModels) gets this too.
    """
    return f"Failed for execute the inference request. Model '{model_name}' is not ready."


def decoupled_text(model_name: str) -> str:
    return (
        f"Model {model_name} is using the decoupled. The current BLS request call doesn't "
        "support models using the decoupled transaction policy. Please use 'decoupled=True' "
        "argument to the 'exec' or 'async_exec' calls for decoupled models.'"
    )


class BlsExecutor:
    """Runs BLS requests against the models of one loaded repository."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope

    def __call__(
        self, request: pb_utils.InferenceRequest, decoupled: bool
    ) -> pb_utils.InferenceResponse | pb_utils.ResponseIterator:
        if decoupled:
            iterator = self.stream(request)
            # As Triton's stub: a decoupled call returns once the first response (or the final
            # flag) is in, so `await async_exec(decoupled=True)` waits in the executor, off the
            # model's event loop, and the model's `for r in iterator` starts with something to
            # read rather than blocking that loop [S].
            iterator._wait_for_first()
            return iterator
        return self.call(request)

    # -- the two ways of calling ----------------------------------------------------------------

    def call(self, request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse:
        """`exec()`: one response, waited for."""
        name = request._model_name
        model, version = self._target(request)
        remote = self.scope.remote if model is None else None
        if remote is not None:
            return self._call_remote(remote, request)
        if version is None:
            return _error(error_prefix(name) + not_ready_text(name))
        if _is_decoupled(version):
            return _error(error_prefix(name) + decoupled_text(name))

        done = threading.Event()
        responses: list[pb_utils.InferenceResponse] = []
        instance = calling_instance(self.scope.models)
        blocked = BlockedCall(instance, version) if instance is not None else None

        def respond(response: pb_utils.InferenceResponse | None, final: bool) -> None:
            if response is not None:
                responses.append(response)
            if final:
                done.set()
                if blocked is not None:
                    blocked.wake()

        infer_request = to_infer_request(request)
        validated = [True]

        def submit() -> None:
            try:
                validated[0] = model.submit(infer_request, respond) is not None
            except BaseException as exc:  # the wait below must still end
                _answer_failed_call(respond, name, exc)

        def lend(lender: Any) -> None:
            try:
                validated[0] = _run_nested(version, lender, infer_request, respond)
            except BaseException as exc:
                _answer_failed_call(respond, name, exc)

        if blocked is None:
            submit()
            done.wait()
        else:
            blocked.start(submit, lend)
            blocked.wait()
        response = responses[-1] if responses else pb_utils.InferenceResponse._create([])
        return _as_bls_response(response, name, request, rejected=not validated[0])

    def stream(self, request: pb_utils.InferenceRequest) -> pb_utils.ResponseIterator:
        """`exec(decoupled=True)`: an iterator the callee's responses are put into as they come.

        A decoupled callee's flag-only final shows up as a last empty response [V]; a default
        model's single response ends the iteration by itself [V].
        """
        name = request._model_name
        model, version = self._target(request)
        remote = self.scope.remote if model is None else None
        if remote is not None:
            return self._stream_remote(remote, request)
        handle: list[Any] = []

        def cancel() -> None:
            if handle and handle[0] is not None:
                handle[0].cancel()

        iterator = pb_utils.ResponseIterator._create(cancel)
        if version is None:
            iterator._put(_error(error_prefix(name) + not_ready_text(name)), True)
            return iterator
        # The request checks answer synchronously, on this thread, before submit returns; the
        # callee's own responses come from its instance thread.
        submitting: list[int | None] = [threading.get_ident()]

        def respond(response: pb_utils.InferenceResponse | None, final: bool) -> None:
            if response is not None:
                rejected = submitting[0] == threading.get_ident()
                response = _as_bls_response(response, name, request, rejected=rejected)
            iterator._put(response, final)

        pending = model.submit(to_infer_request(request), respond)
        submitting[0] = None
        handle.append(pending)
        return iterator

    # -- models other processes serve -----------------------------------------------------------

    def _call_remote(
        self, remote: RemoteModels, request: pb_utils.InferenceRequest
    ) -> pb_utils.InferenceResponse:
        """`exec()` of a model another process serves: one response, waited for."""
        name = request._model_name
        refusal = _remote_refusal(remote, request, decoupled=False)
        if refusal is not None:
            return refusal
        done = threading.Event()
        responses: list[pb_utils.InferenceResponse] = []
        rejected = [False]

        def respond(
            response: pb_utils.InferenceResponse | None, final: bool, was_rejected: bool
        ) -> None:
            if response is None and was_rejected:  # gone since find(): nobody serves it
                response, was_rejected = _error(error_prefix(name) + not_ready_text(name)), False
            if response is not None:
                responses.append(response)
                rejected[0] = was_rejected
            if final:
                done.set()

        try:
            remote.submit(name, to_infer_request(request), respond)
        except BaseException as exc:  # the wait below must still end
            _answer_failed_call(lambda r, f: respond(r, f, False), name, exc)
        done.wait()
        response = responses[-1] if responses else pb_utils.InferenceResponse._create([])
        return _as_bls_response(response, name, request, rejected=rejected[0])

    def _stream_remote(
        self, remote: RemoteModels, request: pb_utils.InferenceRequest
    ) -> pb_utils.ResponseIterator:
        """`exec(decoupled=True)` of a model another process serves."""
        name = request._model_name
        calls: list[Any] = []

        def cancel() -> None:
            if calls:
                calls[0].cancel()

        iterator = pb_utils.ResponseIterator._create(cancel)
        refusal = _remote_refusal(remote, request, decoupled=True)
        if refusal is not None:
            iterator._put(refusal, True)
            return iterator

        def respond(
            response: pb_utils.InferenceResponse | None, final: bool, rejected: bool
        ) -> None:
            if response is None and rejected:  # gone since find(): nobody serves it
                response = _error(error_prefix(name) + not_ready_text(name))
            elif response is not None:
                response = _as_bls_response(response, name, request, rejected=rejected)
            iterator._put(response, final)

        try:
            calls.append(remote.submit(name, to_infer_request(request), respond))
        except BaseException as exc:
            _answer_failed_call(lambda r, f: respond(r, f, False), name, exc)
        return iterator

    # -- helpers --------------------------------------------------------------------------------

    def _target(self, request: pb_utils.InferenceRequest) -> tuple[Any, Any]:
        """(model, the version the request selects), or (model or None, None) if not served."""
        model = self.scope.models.get(request._model_name)
        if model is None:
            return None, None
        wanted = request._model_version
        versions = model.versions
        if wanted == -1:
            return model, getattr(model, "latest", None) or versions[max(versions)]
        return model, versions.get(wanted)


def to_infer_request(request: pb_utils.InferenceRequest) -> InferRequest:
    """The loader's request for a BLS request: same tensors, metadata as request parameters."""
    parameters: dict[str, Any] = json.loads(request._parameters) if request._parameters else {}
    if request._correlation_id not in (0, ""):
        parameters["sequence_id"] = request._correlation_id
    if request._flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
        parameters["sequence_start"] = True
    if request._flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
        parameters["sequence_end"] = True
    if request._timeout:
        parameters["timeout"] = request._timeout
    # Given `trace=request.trace()` of a traced request: the call is a child of its trace.
    caller = getattr(request._trace, "_request_trace", None)
    return InferRequest(
        inputs=[handed_over(t) for t in request._inputs],
        requested_outputs=sorted(request._requested_output_names),
        request_id=request._request_id,
        parameters=parameters,
        model_version=request._model_version,
        trace=None if caller is None else caller.child("BLS"),
    )


def _run_nested(version: Any, instance: Any, request: InferRequest, respond: Any) -> bool:
    """Run `request` on `instance` right here (its thread lent by a waiting exec()).

    `ModelVersion.submit` without the queue: `execute` is called directly. Returns False when the
    request checks refused it.
    """
    pending = version.admit(request, respond)
    if pending is None:
        return False
    if pending.closed:  # answered from the response cache
        return True
    run_execute(instance, [pending], version.decoupled)
    return True


def _remote_refusal(
    remote: RemoteModels, request: pb_utils.InferenceRequest, decoupled: bool
) -> pb_utils.InferenceResponse | None:
    """Triton's answer for a remote call that must not be sent (unknown model or version, a
    decoupled target without `decoupled=True`), or None to send it."""
    name = request._model_name
    target = remote.find(name)
    wanted = request._model_version
    if target is None or (wanted != -1 and wanted not in target.versions):
        return _error(error_prefix(name) + not_ready_text(name))
    if not decoupled and target.decoupled:
        return _error(error_prefix(name) + decoupled_text(name))
    return None


def _answer_failed_call(respond: Any, model_name: str, exc: BaseException) -> None:
    """End a call whose way in raised: its exec() gets an INTERNAL error, not a hang."""
    log.error("BLS call to '%s' failed: %r", model_name, exc, exc_info=exc)
    message = f"internal error: {type(exc).__name__}: {exc}"
    respond(pb_utils.InferenceResponse._create([], pb_utils.TritonError(message)), True)


def _is_decoupled(version: Any) -> bool:
    return bool(version.config.model_transaction_policy.decoupled)


def _error(message: str, code: int = BLS_ERROR_CODE) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse._create([], pb_utils.TritonError(message, code))


def _as_bls_response(
    response: pb_utils.InferenceResponse,
    model_name: str,
    request: pb_utils.InferenceRequest,
    *,
    rejected: bool,
) -> pb_utils.InferenceResponse:
    """The response as the caller of `request` gets it: its outputs where the request's
    `preferred_memory` asks, or Triton's form of a BLS error: prefixed when the callee never
    ran; code INTERNAL.

    Except CANCELLED: `ResponseIterator.cancel()` comes from the Triton releases that hand the
    callee's code back (25.05+ [S]), and a caller that cancels checks for CANCELLED
    (decoupled_test.py test_decoupled_bls_cancel [T]); 2.51's INTERNAL would make cancel()
    unusable. Every other code stays INTERNAL, as 2.51 answers [V].
    """
    error = response.error()
    if error is None:
        return response_handed_over(response, request._preferred_memory)
    message = error.message()
    if rejected:
        message = error_prefix(model_name) + message
    if error.code() == pb_utils.TritonError.CANCELLED:
        return _error(message, pb_utils.TritonError.CANCELLED)
    return _error(message)
