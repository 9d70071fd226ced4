"""`Scope`: the models BLS calls and ensemble steps of one loaded repository reach.

First the repository's own `models` dict (read at call time, never copied, so a model swapped in
place by hot reload is what the next BLS call or ensemble step reaches) and the `statuses` of
those that failed; then, for a name not loaded here, the models other processes serve, through
`remote` (a remote.RemoteModels the server sets, or None: only local models are reachable).

Each `LoadedRepository` owns one; nothing here is process-wide, so two repositories in one
process each reach their own models.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .remote import RemoteModels


class Scope:
    __slots__ = ("models", "statuses", "remote")

    def __init__(
        self,
        models: Mapping[str, Any] | None = None,
        statuses: Mapping[str, Any] | None = None,
        remote: RemoteModels | None = None,
    ) -> None:
        self.models: Mapping[str, Any] = models if models is not None else {}
        self.statuses: Mapping[str, Any] = statuses if statuses is not None else {}
        self.remote = remote

    def failure_reason(self, name: str) -> str | None:
        """Why model `name` failed to load, if it is known to have failed."""
        status = self.statuses.get(name)
        if status is None or getattr(status, "ready", True):
            return None
        return str(getattr(status, "reason", ""))
