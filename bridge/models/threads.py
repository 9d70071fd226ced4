"""Model code (a load's `initialize`, a close's `finalize`) run on a daemon thread of its own."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any


def on_daemon_thread(
    loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any
) -> asyncio.Future[Any]:
    """Run `fn(*args)` on a new daemon thread; its result or exception settles the future.

    One that never returns must not take a thread of the shared executor for good, nor be
    joined at exit; its future then simply never settles (callers bound their waits).
    """
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        try:
            result, error = fn(*args), None
        except BaseException as exc:  # handed to the awaiting coroutine
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:
            pass  # the loop is closed: nobody waits any more

    name = getattr(fn, "__name__", "call")
    threading.Thread(target=run, name=f"bridge-{name}", daemon=True).start()
    return future
