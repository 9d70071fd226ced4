"""The model loading API models call (`pb_utils.load_model`, `unload_model`, `is_model_ready`),
backed by the ModelManager: what a repository's `ModelServices.control` is in a server."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Any

from model_repository_loader.pb_utils.errors import ErrorCode

from .errors import NOT_EXPLICIT, SERVER_NOT_READY, ControlError
from .manager import ModelManager


class ModelControl:
    """`pb_utils.load_model` / `unload_model` / `is_model_ready`, called on model threads.

    Installed before the start-up load, so calls during it get Triton's "Server not ready".
    Each call waits for the manager on the event loop; the loop never waits for a model.
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.manager: ModelManager | None = None

    def _ready_manager(self) -> ModelManager:
        if self.manager is None or not self.manager.ready:
            raise ControlError(SERVER_NOT_READY, ErrorCode.UNAVAILABLE)
        return self.manager

    def _call(self, coroutine_fn: Any, *args: Any) -> None:
        manager = self._ready_manager()
        if self.mode != "explicit":
            raise ControlError(NOT_EXPLICIT, ErrorCode.UNAVAILABLE)
        future: Future[None] = asyncio.run_coroutine_threadsafe(
            coroutine_fn(manager, *args), manager.loop
        )
        future.result()

    def load_model(self, model_name: str, config: str, files: dict[str, bytes] | None) -> None:
        self._call(ModelManager.load, model_name, config, files)

    def unload_model(self, model_name: str, unload_dependents: bool) -> None:
        self._call(ModelManager.unload, model_name)

    def is_model_ready(self, model_name: str, model_version: str) -> bool:
        return self._ready_manager().is_model_ready(model_name, model_version)
