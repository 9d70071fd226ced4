"""Keeping synchronous BLS calls from deadlocking: a waiting instance lends its thread.

In Triton a BLS call is an ordinary request into the server. If model A (one instance) calls
itself, or A calls B which calls A, the inner request queues for an instance that is busy waiting
for that very request, and both wait forever [V: `recurse` in tests/repositories/composition].

Here every `exec()` made on an instance thread is recorded as a wait of that instance on the
target model version. Before a call is queued, the wait graph is checked: if every instance of
the target is itself waiting, directly or through other waits, on calls that cannot progress,
queuing would deadlock. Then the request runs *nested* on the thread of one of those waiting
instances, the way a recursive function call runs on its caller's stack: that thread is blocked
in `exec()` anyway, and its wait loop runs the lent work and goes back to waiting. Requests that
can progress are queued as usual, so models that work in Triton see exactly Triton's scheduling.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import pb_utils

InstanceKey = tuple[str, str, str]  # (model name, instance name, version directory)


@dataclass(eq=False)
class Wait:
    """One blocked `exec()`: which instance waits, on which model version, and its mailbox."""

    key: InstanceKey
    instance: Any  # the waiting ModelInstance, whose thread runs lent work
    target: Any  # the ModelVersion waited on (None: something that always progresses)
    mailbox: queue.SimpleQueue[Callable[[], None] | None] = field(default_factory=queue.SimpleQueue)
    running: bool = False  # running lent work right now (so not blocked)


_lock = threading.Lock()
_waits: dict[InstanceKey, list[Wait]] = {}


def instance_key(instance: Any) -> InstanceKey:
    spec = instance.spec
    return (spec.model_name, spec.instance_name, str(spec.model_file.parent))


def calling_instance(models: Any) -> Any | None:
    """The ModelInstance whose own thread is running this code, if any."""
    context = pb_utils.context.current_model()
    if context is None:
        return None
    model = models.get(context.model_name)
    for version in getattr(model, "versions", {}).values():
        for instance in getattr(version, "instances", ()):
            spec = getattr(instance, "spec", None)
            if (
                spec is not None
                and spec.instance_name == context.instance_name
                and str(spec.model_file.parent) == context.version_dir
                and getattr(instance, "_thread", None) is threading.current_thread()
            ):
                return instance
    return None


def _top(key: InstanceKey) -> Wait | None:
    stack = _waits.get(key)
    return stack[-1] if stack else None


def _can_progress(version: Any, seen: set[int]) -> bool:
    """Will a request queued for `version` ever get an instance? (called under _lock)"""
    instances = getattr(version, "instances", None)
    if not instances:
        return True  # an ensemble or anything without instances of its own
    if id(version) in seen:
        return False
    seen.add(id(version))
    tops = [_top(instance_key(i)) for i in instances]
    if any(top is None or top.running for top in tops):
        return True  # an instance is idle or executing: it will come back for the queue
    return any(_can_progress(top.target, seen) for top in tops if top is not None)


def _lender(version: Any) -> Wait | None:
    for instance in getattr(version, "instances", ()):
        top = _top(instance_key(instance))
        if top is not None and not top.running:
            return top
    return None


class BlockedCall:
    """The bookkeeping of one synchronous BLS call made on an instance thread.

    `start(submit, lend)` runs `submit()` when the target can progress, else `lend(instance)`
    on a waiting instance's thread; `wait(done)` then blocks until `done` is set, running any
    work lent to this thread meanwhile.
    """

    def __init__(self, instance: Any, target: Any) -> None:
        self._wait = Wait(instance_key(instance), instance, target)

    def start(self, submit: Callable[[], None], lend: Callable[[Any], None]) -> None:
        wait = self._wait
        with _lock:
            _waits.setdefault(wait.key, []).append(wait)
            lender = None if _can_progress(wait.target, set()) else _lender(wait.target)
            if lender is not None:
                # Posted under the lock: the lender cannot stop waiting before it is queued.
                lender.mailbox.put(_lent(lender, lend))
        if lender is None:
            submit()

    def wake(self) -> None:
        """Called (from any thread) when the awaited response is complete."""
        self._wait.mailbox.put(None)

    def wait(self) -> None:
        wait = self._wait
        try:
            while (work := wait.mailbox.get()) is not None:
                work()
        finally:
            with _lock:
                stack = _waits.get(wait.key, [])
                if wait in stack:
                    stack.remove(wait)
                if not stack:
                    _waits.pop(wait.key, None)
            # Work lent just as the response arrived still runs here, before exec() returns.
            while True:
                try:
                    work = wait.mailbox.get_nowait()
                except queue.Empty:
                    break
                if work is not None:
                    work()


def _lent(lender: Wait, lend: Callable[[Any], None]) -> Callable[[], None]:
    def run() -> None:
        lender.running = True
        try:
            lend(lender.instance)
        finally:
            lender.running = False

    return run
