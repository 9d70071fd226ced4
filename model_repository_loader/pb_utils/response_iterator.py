"""`ResponseIterator`: the responses of a BLS request made with `exec(decoupled=True)`.

The BLS executor creates one with `ResponseIterator._create(cancel)` and feeds it from any thread
with `_put(response, final)`, exactly as a `deliver` callback receives responses. The model
iterates: `__next__` blocks until the next response and raises StopIteration after the final one.
A flag-only final (`_put(None, True)`) shows up as one last empty response, as in Triton [V].
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from .response import InferenceResponse

_END = object()


class ResponseIterator:
    __slots__ = ("_items", "_ready", "_cancel", "_finished")
    _items: deque[Any]
    _ready: threading.Condition
    _cancel: Callable[[], None] | None
    _finished: bool

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("ResponseIterator objects are created by InferenceRequest.exec()")

    @classmethod
    def _create(cls, cancel: Callable[[], None] | None = None) -> ResponseIterator:
        """An empty iterator; `cancel` is called (once per call) by `ResponseIterator.cancel()`."""
        iterator = cls.__new__(cls)
        iterator._items = deque()
        iterator._ready = threading.Condition(threading.Lock())
        iterator._cancel = cancel
        iterator._finished = False
        return iterator

    def _put(self, response: InferenceResponse | None, final: bool) -> None:
        """Producer side: one response (None only with final=True)."""
        with self._ready:
            if response is None and final:
                response = InferenceResponse._create([])
            if response is not None:
                self._items.append(response)
            if final:
                self._items.append(_END)
            self._ready.notify_all()

    def _wait_for_first(self) -> None:
        """Block until the callee's first response (or its final flag) has arrived."""
        with self._ready:
            while not self._items and not self._finished:
                self._ready.wait()

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        with self._ready:
            if self._finished:
                raise StopIteration
            while not self._items:
                self._ready.wait()
            item = self._items.popleft()
            if item is _END:
                self._finished = True
                raise StopIteration
            return item

    def cancel(self) -> None:
        """Ask the callee to stop; whether it does (and how soon) is up to the callee."""
        if self._cancel is not None:
            self._cancel()
