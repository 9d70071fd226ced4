"""The door's asynchronous RPC handlers, called from the threads of a synchronous gRPC server.

The door's gRPC wire is a synchronous `grpc.server` (server.py): an RPC runs on a thread, which
costs less per call than grpc.aio, whose every call is a coroutine on the event loop (issue 37,
docs/benchmarks.md). ModelInfer to this process's own models stays on that thread from request
to answer (unary.py). Everything else the door does (directory lookups, the request plane,
other processes' models, streams, repository and settings RPCs) is asynchronous code on the
event loop, written for grpc.aio's handler signature. This module runs that code from a thread:

- `on_loop_unary` runs `handler(request, context)` as a task on the loop and waits for it;
- `on_loop_stream` feeds a stream's requests to `handler(requests, context)` as an async
  iterator (a reader thread moves each one onto the loop) and takes its answers in batches
  (the handler yields lists: every answer ready at the time), a batch when gRPC's thread has
  sent the last, so a client that stops reading holds the handler (the door's bounded outbox,
  servicer.py) rather than memory here.

The handlers see a `LoopContext`: the call's metadata, and `abort`, which ends the handler with
`Aborted`; the thread then aborts the call with that status. A call that ends early (the
client cancels, its deadline passes, the server stops) cancels the handler's task, as grpc.aio
would.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, NoReturn

import grpc


class Aborted(Exception):
    """A handler's `context.abort(code, details)`: the call ends with this status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.code = code
        self.details = details


class LoopContext:
    """What the door's asynchronous handlers use of a grpc.aio ServicerContext, over the
    synchronous server's context of the same call."""

    __slots__ = ("_context",)

    def __init__(self, context: grpc.ServicerContext) -> None:
        self._context = context

    def invocation_metadata(self) -> Any:
        return self._context.invocation_metadata()

    def time_remaining(self) -> float | None:
        return self._context.time_remaining()

    async def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise Aborted(code, details)


UnaryHandler = Callable[[Any, Any], Coroutine[Any, Any, Any]]
StreamHandler = Callable[[AsyncIterator[Any], Any], AsyncIterator[Any]]


def on_loop_unary(
    handler: UnaryHandler, loop: asyncio.AbstractEventLoop
) -> Callable[[Any, grpc.ServicerContext], Any]:
    """A synchronous unary handler that runs `handler` on `loop` and answers what it returns."""

    def handle(request: Any, context: grpc.ServicerContext) -> Any:
        task: concurrent.futures.Future[Any]
        task = asyncio.run_coroutine_threadsafe(handler(request, LoopContext(context)), loop)
        if not context.add_callback(lambda: _cancel(task)):  # the call has ended already
            task.cancel()
        return _result(task, context)

    return handle


def on_loop_stream(
    handler: StreamHandler, loop: asyncio.AbstractEventLoop, readers: concurrent.futures.Executor
) -> Callable[[Iterator[Any], grpc.ServicerContext], Iterator[Any]]:
    """A synchronous stream handler that runs `handler` on `loop`; `readers` gives each stream
    the thread that reads its client's requests (the call's own thread sends the answers)."""

    def handle(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        incoming = _Incoming(loop)
        answers = handler(incoming.iterate(), LoopContext(context))
        step = _Step(loop, answers)
        if not context.add_callback(step.cancel):
            return
        readers.submit(incoming.read, requests)
        try:
            while (batch := step.next(context)) is not _END:
                yield from batch
        finally:  # the reader ends with the call: gRPC ends its request iterator
            incoming.close()
            if not loop.is_closed():
                asyncio.run_coroutine_threadsafe(_close(answers), loop)

    return handle


_END = object()  # the end of a stream's requests, and of its answers


def _cancel(task: concurrent.futures.Future[Any]) -> None:
    task.cancel()


def _result(task: concurrent.futures.Future, context: grpc.ServicerContext) -> Any:
    """What the handler's `task` returned; its abort as the call's status."""
    try:
        return task.result()
    except Aborted as abort:
        context.abort(abort.code, abort.details)  # raises
    except concurrent.futures.CancelledError:
        # The call ended first (the client cancelled, its deadline passed, the server
        # stopped): gRPC sends nothing more; this only ends the handler without a log line.
        context.abort(grpc.StatusCode.CANCELLED, "the call ended")


class _Step:
    """A stream handler's answers taken from the loop a batch at a time; `cancel` (any
    thread) cancels the step in progress and every later one."""

    def __init__(self, loop: asyncio.AbstractEventLoop, answers: AsyncIterator[Any]) -> None:
        self._loop = loop
        self._answers = answers
        self._lock = threading.Lock()
        self._current: concurrent.futures.Future | None = None
        self._cancelled = False

    def next(self, context: grpc.ServicerContext) -> Any:
        with self._lock:
            if self._cancelled:
                return _END
            self._current = task = asyncio.run_coroutine_threadsafe(self._take(), self._loop)
        return _result(task, context)

    async def _take(self) -> Any:
        try:
            return await anext(self._answers)
        except StopAsyncIteration:
            return _END

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            if self._current is not None:
                self._current.cancel()


# Requests of a stream the reader thread may take from gRPC ahead of the handler: enough that it
# seldom waits (a wake-up per request cost a stream of small requests 40% of its rate), few
# enough that a handler that stops asking holds the client's sends, not its requests.
READ_AHEAD = 32


class _Incoming:
    """A stream's requests, read on a thread of their own and handed to the loop, at most
    READ_AHEAD ahead of the handler: a handler that stops asking (servicer.py bounds a stream's
    requests in flight) soon stops the reading, and gRPC's flow control then holds the
    client's sends, rather than every request it sends waiting here."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._room = threading.Semaphore(READ_AHEAD)  # requests the reader may take now
        self._closed = False

    def read(self, requests: Iterator[Any]) -> None:
        """On a reader thread: each request of the stream while there is room, then the end
        (or the failure); nothing more once the call is over (`close`)."""
        put = self._queue.put_nowait
        try:
            while self._room.acquire() and not self._closed:
                request = next(requests, _END)
                self._loop.call_soon_threadsafe(put, request)
                if request is _END:
                    return
            self._loop.call_soon_threadsafe(put, _END)  # the call is over: nothing more comes
        except BaseException as exc:  # the call broke: the handler's read ends with it
            self._loop.call_soon_threadsafe(put, exc)

    def close(self) -> None:
        """The call is over (any thread): a reader waiting for room ends."""
        self._closed = True
        self._room.release()

    async def iterate(self) -> AsyncIterator[Any]:
        while (request := await self._queue.get()) is not _END:
            self._room.release()  # taken by the handler: the reader may take one more
            if isinstance(request, BaseException):
                raise request
            yield request


async def _close(answers: AsyncIterator[Any]) -> None:
    aclose = getattr(answers, "aclose", None)
    if aclose is not None:
        await aclose()
