"""The models BLS calls and ensemble steps are looked up in: the process's loaded repository,
then the models other processes serve.

`LoadedRepository` binds its `models` dict (and the `statuses` of models that failed) here when
it is created. The dict is read at call time, never copied, so a model swapped in place by hot
reload is what the next BLS call or ensemble step reaches. A name not in it goes to the
`RemoteModels` installed with `bind_remote` (remote.py), if any.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_models: Mapping[str, Any] = {}
_statuses: Mapping[str, Any] = {}
_remote: Any = None  # a remote.RemoteModels, or None: only local models are reachable


def bind(models: Mapping[str, Any], statuses: Mapping[str, Any] | None = None) -> None:
    """Make `models` (name → Model / EnsembleModel) the ones BLS and ensembles reach."""
    global _models, _statuses
    _models = models
    _statuses = statuses if statuses is not None else {}


def models() -> Mapping[str, Any]:
    return _models


def failure_reason(name: str) -> str | None:
    """Why model `name` failed to load, if it is known to have failed."""
    status = _statuses.get(name)
    if status is None or getattr(status, "ready", True):
        return None
    return str(getattr(status, "reason", ""))


def bind_remote(remote: Any) -> None:
    """Make `remote` (a remote.RemoteModels, or None) what names not loaded here go to."""
    global _remote
    _remote = remote


def remote() -> Any:
    """The installed remote.RemoteModels, or None."""
    return _remote
