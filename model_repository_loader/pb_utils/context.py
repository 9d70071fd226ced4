"""Which model instance is running on this thread, and in which lifecycle phase.

Triton gives every instance its own process, so module-level functions such as `get_model_dir()`
or the instance name in metric errors simply know "their" model. Here many instances can share a
process, so the loader binds an instance to the thread (or asyncio task) that runs it:

    with model_context(model_name="m", instance_name="m_0", version_dir="/models/m/1"):
        with phase("initialize"):
            model.initialize(args)
        ...
        with phase("execute"):
            model.execute(requests)

Threads a model starts itself do not inherit the binding (contextvars are per thread). For them
`current_model()` falls back to the only bound instance in the process, if there is exactly one
(always the case for process-isolated instances), and the phase falls back to that instance's.
"""

from __future__ import annotations

import threading
from contextvars import ContextVar, Token
from typing import Any

PHASES = frozenset({"auto_complete", "initialize", "execute", "finalize"})
# BLS is refused while the instance is being set up or torn down; threads that never entered a
# phase (a model's own worker threads) may use it, as they can in Triton once `initialize` is done.
_NO_BLS_PHASES = frozenset({"auto_complete", "initialize", "finalize"})


class ModelContext:
    """One bound model instance. `phase` is the instance's current phase (or None);
    `services` what its repository offers it (services.ModelServices), or None."""

    __slots__ = ("model_name", "instance_name", "version_dir", "phase", "services")

    def __init__(
        self, model_name: str, instance_name: str, version_dir: str, services: Any = None
    ) -> None:
        self.model_name = model_name
        self.instance_name = instance_name
        self.version_dir = version_dir
        self.phase: str | None = None
        self.services = services

    def __repr__(self) -> str:
        return f"<ModelContext {self.instance_name!r} phase={self.phase!r}>"


_MODEL: ContextVar[ModelContext | None] = ContextVar("pb_utils_model", default=None)
_PHASE: ContextVar[str | None] = ContextVar("pb_utils_phase", default=None)

# Bound contexts across all threads, for the fallback of threads without a binding.
_bound_lock = threading.Lock()
_bound: dict[int, list[Any]] = {}  # id(ctx) -> [ctx, times bound]
_sole: ModelContext | None = None
# Told when an instance's last binding ends (the instance is gone): e.g. its metric families go.
_unbound_listeners: list[Any] = []


def on_unbound(listener: Any) -> None:
    """Call `listener(context)` whenever a context's last binding ends."""
    _unbound_listeners.append(listener)


class model_context:  # noqa: N801 - used like a function: `with model_context(...):`
    """Bind a model instance to the current thread/task for the duration of the block.

    `__enter__` returns the `ModelContext`. Pass `context=` to re-bind an existing one (for
    example on another thread of the same instance), so they share the phase.

    `counted=False` binds it on this thread only: the process does not count it as one of its
    instances (no fallback for other threads, no unbound event). For a thread that acts for an
    instance living in another process (isolation/), whose end its owner handles.
    """

    __slots__ = ("_context", "_token", "_counted")

    def __init__(
        self,
        model_name: str = "",
        instance_name: str = "",
        version_dir: str = "",
        *,
        context: ModelContext | None = None,
        counted: bool = True,
    ) -> None:
        self._context = context or ModelContext(model_name, instance_name, version_dir)
        self._token: Token[ModelContext | None] | None = None
        self._counted = counted

    def __enter__(self) -> ModelContext:
        self._token = _MODEL.set(self._context)
        if self._counted:
            _register(self._context)
        return self._context

    def __exit__(self, *exc: object) -> None:
        if self._counted:
            _unregister(self._context)
        if self._token is not None:
            _MODEL.reset(self._token)
            self._token = None


class phase:  # noqa: N801 - used like a function: `with phase("execute"):`
    """Mark the current thread (and its bound instance) as being in a lifecycle phase."""

    __slots__ = ("_name", "_token", "_context", "_previous")

    def __init__(self, name: str) -> None:
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; expected one of {sorted(PHASES)}")
        self._name = name
        self._token: Token[str | None] | None = None
        self._context: ModelContext | None = None
        self._previous: str | None = None

    def __enter__(self) -> None:
        self._token = _PHASE.set(self._name)
        context = _MODEL.get()
        if context is not None:
            self._context = context
            self._previous = context.phase
            context.phase = self._name

    def __exit__(self, *exc: object) -> None:
        if self._context is not None:
            self._context.phase = self._previous
            self._context = None
        if self._token is not None:
            _PHASE.reset(self._token)
            self._token = None


def current_model() -> ModelContext | None:
    """The instance bound to this thread/task, else the process's only bound instance."""
    context = _MODEL.get()
    return context if context is not None else _sole


def current_phase() -> str | None:
    name = _PHASE.get()
    if name is not None:
        return name
    context = current_model()
    return context.phase if context is not None else None


def in_execute() -> bool:
    return current_phase() == "execute"


def bls_allowed() -> bool:
    """False during auto_complete / initialize / finalize, where Triton refuses BLS."""
    return current_phase() not in _NO_BLS_PHASES


def instance_name() -> str:
    """The current instance's name ("" when none is bound), as used in Triton's messages."""
    context = current_model()
    return context.instance_name if context is not None else ""


def _register(context: ModelContext) -> None:
    global _sole
    with _bound_lock:
        entry = _bound.setdefault(id(context), [context, 0])
        entry[1] += 1
        _sole = _only_bound()


def _unregister(context: ModelContext) -> None:
    global _sole
    unbound = False
    with _bound_lock:
        entry = _bound.get(id(context))
        if entry is not None:
            entry[1] -= 1
            if entry[1] <= 0:
                del _bound[id(context)]
                unbound = True
        _sole = _only_bound()
    if unbound:
        for listener in _unbound_listeners:
            listener(context)


def _only_bound() -> ModelContext | None:
    if len(_bound) != 1:
        return None
    return next(iter(_bound.values()))[0]
