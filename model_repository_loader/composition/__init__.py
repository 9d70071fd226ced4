"""Composition: BLS calls between models of this process, and ensembles.

- `install(models, statuses)`: make BLS (`pb_utils.InferenceRequest.exec` / `async_exec`) and
  ensemble steps reach the models of a loaded repository (`LoadedRepository` does it).
- `BlsExecutor`: the BLS executor itself (bls.py); `waits.py` keeps BLS from deadlocking.
- `EnsembleModel`: an ensemble served like a model (ensemble.py); `load_ensemble` / `load_order`
  load ensembles after their composing models, with Triton's checks (loading.py).
- `set_remote_models(remote)`: BLS calls and ensemble steps for models other processes serve
  (remote.py: the `RemoteModels` seam; the Dynamo bridge implements it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import pb_utils
from . import registry
from .bls import BlsExecutor
from .ensemble import EnsembleModel, EnsembleRun
from .loading import check_steps, load_ensemble, load_order, step_models
from .remote import RemoteCall, RemoteModels, RemoteRespond, RemoteTarget

__all__ = [
    "BlsExecutor",
    "uninstall",
    "EnsembleModel",
    "EnsembleRun",
    "RemoteCall",
    "RemoteModels",
    "RemoteRespond",
    "RemoteTarget",
    "check_steps",
    "install",
    "load_ensemble",
    "load_order",
    "set_remote_models",
    "step_models",
]


def install(models: Mapping[str, Any], statuses: Mapping[str, Any] | None = None) -> BlsExecutor:
    """Bind BLS and ensembles to `models` (read live, never copied) and return the executor."""
    registry.bind(models, statuses)
    executor = BlsExecutor(models)
    pb_utils.set_bls_executor(executor)
    return executor


def uninstall(models: Mapping[str, Any]) -> None:
    """Undo `install(models)`, if it is still the installed one (a closed repository)."""
    if registry.models() is models:
        registry.bind({}, {})
        pb_utils.set_bls_executor(None)


def set_remote_models(remote: RemoteModels | None) -> None:
    """Send BLS calls and ensemble steps for models not loaded here to `remote` (None: off)."""
    registry.bind_remote(remote)
