"""A refused or failed load/unload, with Triton's texts [V, 2.51]."""

from __future__ import annotations

from model_repository_loader.errors import TritonStatusError

NOT_EXPLICIT = "explicit model load / unload is not allowed if polling is enabled"
SERVER_NOT_READY = "Server not ready"


class ControlError(TritonStatusError):
    """A refused or failed load/unload; str() is Triton's message, `code` its status."""


def poll_failed(name: str) -> ControlError:
    return ControlError(f"failed to load '{name}', failed to poll from model repository")
