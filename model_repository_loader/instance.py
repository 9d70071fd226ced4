"""One model instance: a `TritonPythonModel` object and the thread it lives on.

Every call into the model (`initialize`, `execute`, `finalize`) runs on the instance's own thread,
never on the caller's: one slow model cannot stall the server's event loop or another model, and a
model sees the thread affinity it would see in Triton's one-process-per-instance stub.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import pb_utils
from .errors import ModelLoadError, format_python_error
from .importer import ModelImportError, bind_model_folders, import_model_module

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """Where an instance comes from and the `args` its `initialize` receives."""

    model_name: str
    instance_name: str
    kind: str  # "CPU", "GPU" or "MODEL"
    device_id: int
    model_file: Path
    version: int
    args: dict[str, str]


class ModelInstance:
    """A `TritonPythonModel` object with a private thread that runs every call into it."""

    def __init__(self, spec: InstanceSpec) -> None:
        self.spec = spec
        self.name = spec.instance_name
        self.model: Any = None
        # Created on first use by `async def execute` models (see execution.py).
        self.event_loop: asyncio.AbstractEventLoop | None = None
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"instance:{self.name}", daemon=True)
        self._thread.start()

    # -- lifecycle -------------------------------------------------------------------------

    def load(self) -> None:
        """Import model.py, build the model and run `initialize(args)` on the instance thread."""
        self.call(self._load)

    def _load(self) -> None:
        spec = self.spec
        try:
            module = import_model_module(spec.model_file)
        except ModelImportError as exc:
            raise ModelLoadError(str(exc)) from None
        except BaseException as exc:  # SyntaxError, ImportError, SystemExit ...
            raise ModelLoadError(f"Internal: {format_python_error(exc)}") from None
        model_class = getattr(module, "TritonPythonModel", None)
        if model_class is None:
            # The stub's attribute lookup fails; Triton reports that AttributeError [V].
            raise ModelLoadError(
                f"Internal: AttributeError: module '{module.__name__}' has no attribute "
                "'TritonPythonModel'"
            )
        try:
            self.model = model_class()
            initialize = getattr(self.model, "initialize", None)
            if initialize is not None:
                with pb_utils.context.phase("initialize"):
                    initialize(dict(spec.args))
        except BaseException as exc:
            raise ModelLoadError(f"Internal: {format_python_error(exc)}") from None

    def finalize(self) -> None:
        """Run `finalize()` (errors are only logged, as in Triton) and stop the thread."""

        def _finalize() -> None:
            finalize = getattr(self.model, "finalize", None)
            if finalize is None:
                return
            try:
                with pb_utils.context.phase("finalize"):
                    finalize()
            except BaseException as exc:
                log.error("%s: finalize failed: %s", self.name, format_python_error(exc))

        try:
            self.call(_finalize)
        finally:
            self.stop()

    def stop(self) -> None:
        """End the instance thread once the calls already queued have run."""
        self._calls.put(None)
        self._thread.join(timeout=30)

    # -- running calls on the instance thread -----------------------------------------------

    def submit(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the instance thread, after the calls already queued."""
        self._calls.put(fn)

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the instance thread and wait for its result (or exception)."""
        done = threading.Event()
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["value"] = fn()
            except BaseException as exc:  # handed back to the caller
                outcome["error"] = exc
            finally:
                done.set()

        self.submit(run)
        done.wait()
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("value")

    def _run(self) -> None:
        bind_model_folders(self.spec.model_file)
        with pb_utils.context.model_context(
            model_name=self.spec.model_name,
            instance_name=self.name,
            version_dir=str(self.spec.model_file.parent),
        ):
            while (fn := self._calls.get()) is not None:
                fn()
