"""Composition: BLS calls between models, and ensembles.

- `Scope`: the models one loaded repository's BLS calls and ensemble steps reach (scope.py):
  its own, then those other processes serve (remote.py: the `RemoteModels` seam; the Dynamo
  bridge implements it). `LoadedRepository` owns one.
- `BlsExecutor`: the BLS executor itself (bls.py); `waits.py` keeps BLS from deadlocking.
- `EnsembleModel`: an ensemble served like a model (ensemble.py); `load_ensemble` / `load_order`
  load ensembles after their composing models, with Triton's checks (loading.py).
"""

from __future__ import annotations

from .bls import BlsExecutor
from .ensemble import EnsembleModel, EnsembleRun
from .loading import check_steps, load_ensemble, load_order, step_models
from .remote import RemoteCall, RemoteModels, RemoteRespond, RemoteTarget
from .scope import Scope

__all__ = [
    "BlsExecutor",
    "EnsembleModel",
    "EnsembleRun",
    "RemoteCall",
    "RemoteModels",
    "RemoteRespond",
    "RemoteTarget",
    "Scope",
    "check_steps",
    "load_ensemble",
    "load_order",
    "step_models",
]
