"""A model instance's own readiness: the model's `is_ready()`, as python_backend (26.03 on) asks it.

Triton asks each instance of a version whenever a client asks whether that model (or, with
strict readiness, the server) is ready: first whether its stub process is alive, then, when the
model defines `is_ready` (sync or `async def`), what it answers. A model without one is ready.
Not ready, with python_backend's texts: `False` ("Model '<instance>' is not ready (user-defined
check failed)."), an exception (its Python error), anything but a bool ("is_ready() must return a
boolean value"), and an answer slower than READY_CHECK_TIMEOUT_S. Only one call is in flight per
instance: a check that comes while one runs waits for that one (within the same bound) and takes
its answer, and a call that outlived its caller's bound still answers the next caller.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any

from .errors import format_python_error

# python_backend's kUserModelReadinessTimeoutMs.
READY_CHECK_TIMEOUT_S = 5.0
NOT_BOOLEAN = "is_ready() must return a boolean value"
TIMED_OUT = "Timed out waiting for user-defined is_ready() response"
TIMED_OUT_IN_FLIGHT = "Timed out waiting for in-flight is_ready() response"

# What one check answers: None when ready, else why not (the text Triton logs).
Reason = str | None


def not_ready_text(instance_name: str) -> str:
    """`is_ready()` returned False."""
    return f"Model '{instance_name}' is not ready (user-defined check failed)."


def call_is_ready(
    model: Any,
    instance_name: str,
    run_coroutine: Callable[[Coroutine[Any, Any, Any]], Any],
) -> Reason:
    """Call `model.is_ready()` on this thread (a coroutine it returns runs through
    `run_coroutine`, on the instance's event loop as the stub's loop runs it)."""
    try:
        result = model.is_ready()
        if asyncio.iscoroutine(result):
            result = run_coroutine(result)
    except Exception as exc:
        return format_python_error(exc)
    if not isinstance(result, bool):
        return NOT_BOOLEAN
    return None if result else not_ready_text(instance_name)


class ReadyCheck:
    """One instance's `is_ready()` calls: at most one in flight (see the module doc).

    `start()` begins one call elsewhere (a thread, the instance's process) and returns the
    future of its Reason; a future that fails (the process died) answers its exception's text.
    """

    def __init__(self, start: Callable[[], Future[Reason]]) -> None:
        self._start = start
        # Reentrant: a future already done runs its callback at once, on this thread.
        self._lock = threading.RLock()
        self._in_flight: Future[Reason] | None = None

    def check(self, timeout: float = READY_CHECK_TIMEOUT_S) -> Reason:
        with self._lock:
            call = self._in_flight
            late = TIMED_OUT_IN_FLIGHT
            if call is None:
                call = self._in_flight = self._start()
                call.add_done_callback(self._finished)
                late = TIMED_OUT
        try:
            return call.result(timeout)
        except TimeoutError:
            return late
        except Exception as exc:
            return str(exc)

    def _finished(self, call: Future[Reason]) -> None:
        with self._lock:
            if self._in_flight is call:
                self._in_flight = None
