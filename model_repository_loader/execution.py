"""Calling `execute` and holding the model to Triton's contract for what it returns.

`Pending` is one validated request on its way through a model: the `pb_utils.InferenceRequest` the
model sees, and the one path by which its responses leave (`deliver`), whether they come from the
list `execute` returns, from a response sender on any thread, or from an error.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any

from . import pb_utils
from .errors import format_python_error
from .inference import Respond
from .instance import ModelInstance

log = logging.getLogger(__name__)

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class Pending:
    """One request in flight: what the model sees and where its responses go."""

    __slots__ = ("request", "_respond", "_finish", "_closed", "_lock", "_cancelled")

    def __init__(
        self,
        build_request: Callable[[Pending], pb_utils.InferenceRequest],
        respond: Respond,
        finish: Callable[[pb_utils.InferenceResponse | None], pb_utils.InferenceResponse | None],
    ) -> None:
        self._respond = respond
        self._finish = finish
        self._closed = False
        self._lock = threading.Lock()
        self._cancelled = threading.Event()
        self.request = build_request(self)

    @property
    def closed(self) -> bool:
        return self._closed

    def is_cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        self._cancelled.set()

    def deliver(self, response: pb_utils.InferenceResponse | None, final: bool) -> bool:
        """Send one response to the caller; False if the request was already closed."""
        with self._lock:
            if self._closed:
                return False
            self._closed = final
        self._respond(self._finish(response), final)
        return True

    def fail(self, message: str, code: Any = None) -> None:
        error = pb_utils.TritonError(
            message, code if code is not None else pb_utils.TritonError.INTERNAL
        )
        self.deliver(pb_utils.InferenceResponse(error=error), True)


def run_execute(instance: ModelInstance, batch: list[Pending], decoupled: bool) -> None:
    """Run `execute` for one batch on the instance thread and route what comes back."""
    prefix = f"Failed to process the request(s) for model '{instance.name}', message: "
    execute = getattr(instance.model, "execute", None)
    if execute is None:
        _fail_open(
            batch,
            prefix
            + f"Python model {instance.spec.model_file} does not implement `execute` method.",
        )
        return
    try:
        with pb_utils.context.phase("execute"):
            result = execute([p.request for p in batch])
            if inspect.iscoroutine(result):
                result = _instance_loop(instance).run_until_complete(result)
    except BaseException as exc:  # the model's failure goes to its callers, never up
        message = prefix + format_python_error(exc)
        log.error("%s", message)
        _fail_open(batch, message)
        return

    if decoupled:
        if result is not None:
            _fail_open(
                batch,
                prefix
                + f"Python model '{instance.name}' is using the decoupled mode and the execute "
                "function must return None.",
            )
        return

    problem = _check_returned_list(result, len(batch))
    if problem is not None:
        log.error("%s", prefix + problem)
        _fail_open(batch, prefix + problem)
        return
    for pending, response in zip(batch, result, strict=True):
        if response is None:
            continue  # answered, or to be answered, through the response sender
        if not pending.deliver(response, True):
            log.error(
                "%s: the request was already answered through its response sender; "
                "the response returned from execute was dropped",
                instance.name,
            )


def _check_returned_list(result: Any, expected: int) -> str | None:
    if not isinstance(result, list):
        return f"Expected a list in the execute return, found type '{type(result)}'."
    if len(result) != expected:
        return (
            "Number of InferenceResponse objects do not match the number of InferenceRequest "
            f"objects. InferenceRequest(s) size is:{expected}, and InferenceResponse(s) size "
            f"is:{len(result)}\n"
        )
    for response in result:
        if response is not None and not isinstance(response, pb_utils.InferenceResponse):
            return (
                "Expected an 'InferenceResponse' object in the execute function return list, "
                f"found type '{type(response)}'."
            )
    return None


def _fail_open(batch: list[Pending], message: str) -> None:
    for pending in batch:
        pending.fail(message)


def _instance_loop(instance: ModelInstance) -> asyncio.AbstractEventLoop:
    """The event loop that runs this instance's `async def execute` coroutines."""
    if instance.event_loop is None:
        instance.event_loop = asyncio.new_event_loop()
    return instance.event_loop
