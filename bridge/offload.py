"""Work a request asks of the door that grows with what its client sent, run off the event
loop: converting a large request, reading its inputs out of shared memory regions, rendering a
large answer, writing its outputs into regions, moving tensors through the pool of regions
between door and worker.

On a pool of its own, not asyncio's default executor: model loads, the repository's scans and
a shutdown's wait use that one, and one client's flood of large requests must not hold them up.
It has as many threads as asyncio's default would (at most 32).

And to its end: when the request is cancelled meanwhile (its deadline, its client gone, its
stream ended by an error), the await still waits for the thread before it lets the
cancellation through. The request gives its regions back then, and a thread still writing
outputs by region name could otherwise reach a region the client unregistered and another
client registered under the same name.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

THREADS = min(32, (os.cpu_count() or 1) + 4)
_POOL = ThreadPoolExecutor(THREADS, thread_name_prefix="offload")


async def run_off_loop(work: Callable[[], T]) -> T:
    """`work()` on the pool's thread, its context (contextvars) carried as `asyncio.to_thread`
    carries it. Cancelled, work not yet started never runs; work running is waited for to its
    end, through any further cancellation (module doc)."""
    submitted = _POOL.submit(functools.partial(contextvars.copy_context().run, work))
    running = asyncio.wrap_future(submitted)
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        if submitted.cancel():  # still queued: nothing ran, nothing to wait for
            raise
        while not running.done():
            try:
                await asyncio.wait([running])
            except asyncio.CancelledError:  # again: the thread still writes, so wait on
                continue
        if not running.cancelled():
            running.exception()  # retrieved: the request is over, its failure with it
        raise
