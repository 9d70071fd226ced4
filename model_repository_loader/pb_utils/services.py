"""What one loaded repository offers the models in it through `pb_utils`.

Triton runs one server per process, so its stub reaches "the" server. Here a process may hold
several loaded repositories (tests, an application embedding the loader), each with its own
models, so nothing of this is a process global: a `ModelServices` belongs to one
`LoadedRepository`, every instance of it is bound with it (`context.ModelContext.services`), and
`pb_utils` asks the calling instance's services:
- `bls`: runs `InferenceRequest.exec()` / `async_exec()` (composition/bls.py), or None;
- `control`: backs `load_model` / `unload_model` / `is_model_ready` (the server plugs it in), or
  None, when the loading API is "not supported";
- `metrics`: the registry of the custom metric families its models make (metrics.py).

A thread a model started itself is bound to no instance; it gets the process's only bound
instance's services (context.py), else the process's only live `ModelServices`, as a model in
Triton's stub would, and no services at all when that is ambiguous.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import context

if TYPE_CHECKING:
    from .helpers import ModelControl
    from .metrics import MetricRegistry

# exec(request, decoupled) -> InferenceResponse (decoupled=False) or ResponseIterator (True).
BlsExecutor = Callable[[Any, bool], Any]

_live: weakref.WeakSet[ModelServices] = weakref.WeakSet()


class ModelServices:
    __slots__ = ("bls", "control", "metrics", "__weakref__")

    def __init__(
        self,
        bls: BlsExecutor | None = None,
        control: ModelControl | None = None,
        metrics: MetricRegistry | None = None,
    ) -> None:
        """`metrics`: the registry of its models' families; None: the process's own
        (`metrics.REGISTRY`). Given by whoever makes the services, so this module needs no
        import of metrics.py, which imports it."""
        self.bls = bls
        self.control = control
        self.metrics = metrics
        _live.add(self)

    def retire(self) -> None:
        """The repository is closed: no longer a fallback for threads bound to no instance."""
        _live.discard(self)

    def __repr__(self) -> str:
        return f"<ModelServices bls={self.bls is not None} control={self.control is not None}>"


def current() -> ModelServices | None:
    """The calling instance's services (see the module doc for unbound threads)."""
    bound = context.current_model()
    if bound is not None and bound.services is not None:
        return bound.services
    live = list(_live)
    return live[0] if len(live) == 1 else None
