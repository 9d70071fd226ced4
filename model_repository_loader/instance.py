"""One model instance: a `TritonPythonModel` object and the thread it lives on.

Every call into the model (`initialize`, `execute`, `finalize`) runs on the instance's own thread,
never on the caller's: one slow model cannot stall the server's event loop or another model, and a
model sees the thread affinity it would see in Triton's one-process-per-instance stub.

`async def execute` coroutines run on a second thread of the instance, which runs the instance's
own event loop (started on first use, as Triton's stub starts its loop). Coroutines of one instance
interleave there; another model's loop is another thread, so a slow coroutine stalls nobody else.

The instance thread survives whatever a call does: an exception that escapes a call is logged and
the thread takes the next one. `finalize(timeout)` is bounded: an instance whose thread never
comes back (an `execute` that never returns) is abandoned at the bound, logged, and left to die
with the process (its threads are daemons). Once finalized, the instance lets go of the model
object, so a closed version's weights are freed.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from . import pb_utils
from .deadlines import remaining
from .errors import ModelLoadError, format_python_error
from .execution import Pending, run_execute
from .gpu import cuda
from .importer import ModelImportError, bind_model_folders, import_model_module
from .readiness import ReadyCheck, Reason, call_is_ready

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


class Instance(Protocol):
    """One model instance as a model version and its scheduler use it, of either kind: in this
    process on a thread (ModelInstance) or in a process of its own (isolation.IsolatedInstance).
    """

    name: str

    @property
    def alive(self) -> bool: ...
    def load(self) -> None: ...
    def post(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the instance's own thread, after what was posted before (a request
        enters a model by `Model.submit`; work enters an instance's thread by `post`)."""
        ...

    def run_batch(self, batch: list[Pending], decoupled: bool) -> None:
        """Execute one batch; return when the model's `execute` returned."""
        ...

    def check_ready(self) -> Reason:
        """Triton's instance readiness (readiness.py): None when ready, else why not."""
        ...

    def finalize(self, timeout: float | None = ...) -> bool: ...
    def stop(self, timeout: float | None = ...) -> bool: ...


class ModelInstance:
    """A `TritonPythonModel` object with a private thread that runs every call into it."""

    def __init__(self, spec: InstanceSpec, services: pb_utils.ModelServices | None = None) -> None:
        self.spec = spec
        self.services = services  # what the model reaches through pb_utils (BLS, metrics, ...)
        self.name = spec.instance_name
        self.model: Any = None
        # Created on first use by `async def execute` models (see run_coroutine).
        self.event_loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._loop_lock = threading.Lock()  # execute and is_ready() may both start the loop
        self._coroutines = 0
        self._coroutines_done = threading.Condition()
        self._bound_context: pb_utils.context.ModelContext | None = None
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"instance:{self.name}", daemon=True)
        self._thread.start()
        self._ready_check = ReadyCheck(self._start_is_ready)

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

    def finalize(self, timeout: float | None = 30.0) -> bool:
        """Run `finalize()` (errors are only logged, as in Triton) and stop the thread.

        Everything, waiting for running coroutines and for the calls queued before, is bounded
        by `timeout` seconds in total (None: no bound). Returns False if the instance was
        abandoned at the bound: its thread is still busy and is left behind.
        """
        deadline = None if timeout is None else time.monotonic() + timeout

        def _finalize() -> None:
            try:
                # On the instance thread, so the wait counts in the same bound.
                self.wait_coroutines(remaining(deadline))
                finalize = getattr(self.model, "finalize", None)
                if finalize is not None:
                    with pb_utils.context.phase("finalize"):
                        finalize()
            except BaseException as exc:
                log.error("%s: finalize failed: %s", self.name, format_python_error(exc))
            finally:
                self.model = None  # the weights go with the version, not with this object

        try:
            self.call(_finalize, remaining(deadline))
        except TimeoutError:
            log.error(
                "%s: abandoned: still busy after %ss (an execute that does not return?); "
                "finalize stays queued behind it",
                self.name,
                timeout,
            )
            self.stop(0)
            return False
        # Only the stop sentinel is left for the thread: it ends at once, bound or not.
        self.stop(remaining(deadline))
        return True

    def stop(self, timeout: float | None = 30.0) -> bool:
        """End the instance thread (and its event loop) once the calls already queued have run.

        Waits at most `timeout` seconds in total; False if a thread is still running then.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        self._calls.put(None)
        self._thread.join(remaining(deadline))
        stopped = not self._thread.is_alive()
        loop, thread = self.event_loop, self._loop_thread
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)  # the loop thread then closes its loop
            thread.join(remaining(deadline))
            stopped = stopped and not thread.is_alive()
        return stopped

    # -- coroutines (`async def execute`) ----------------------------------------------------

    def run_coroutine(
        self, coroutine: Coroutine[Any, Any, Any], done: Callable[[Future[Any]], None]
    ) -> None:
        """Schedule `coroutine` on the instance's event loop; `done(future)` runs there after.

        The coroutine's task copies the caller's context (model binding and phase).
        """
        loop = self._coroutine_loop()
        with self._coroutines_done:
            self._coroutines += 1

        def finished(future: Future[Any]) -> None:
            try:
                done(future)
            except BaseException as exc:  # a bug in routing must not kill the loop
                log.error("%s: routing a coroutine's result failed: %r", self.name, exc)
            finally:
                with self._coroutines_done:
                    self._coroutines -= 1
                    self._coroutines_done.notify_all()

        asyncio.run_coroutine_threadsafe(coroutine, loop).add_done_callback(finished)

    def wait_coroutines(self, timeout: float | None = None) -> bool:
        """Wait until no coroutine of this instance is running. False on timeout."""
        with self._coroutines_done:
            return self._coroutines_done.wait_for(lambda: self._coroutines == 0, timeout)

    def _coroutine_loop(self) -> asyncio.AbstractEventLoop:
        with self._loop_lock:
            if self.event_loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=self._run_loop,
                    args=(loop,),
                    name=f"instance-loop:{self.name}",
                    daemon=True,
                )
                self.event_loop, self._loop_thread = loop, thread
                thread.start()
            return self.event_loop

    def _run_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        cuda.use_instance_device(self.spec.kind, self.spec.device_id)
        bind_model_folders(self.spec.model_file)
        with pb_utils.context.model_context(context=self._bound_context):
            try:
                loop.run_forever()
            finally:
                # Closed here, by its own thread, so that a stop() that gave up waiting still
                # frees the loop's selector and file descriptors.
                loop.close()
                self.event_loop = self._loop_thread = None

    # -- readiness (`is_ready()`) -------------------------------------------------------------

    @property
    def has_is_ready(self) -> bool:
        """The model defines `is_ready` (known once loaded; the stub caches it the same way)."""
        return self.model is not None and hasattr(self.model, "is_ready")

    def check_ready(self) -> Reason:
        """None when the model has no `is_ready` or it answers True; else why not."""
        return self._ready_check.check() if self.has_is_ready else None

    def run_is_ready(self) -> Reason:
        """Call `is_ready()` now, on the caller's thread, with the instance bound as on its own
        threads (the stub calls it beside `execute`, never behind it)."""
        cuda.use_instance_device(self.spec.kind, self.spec.device_id)
        bind_model_folders(self.spec.model_file)
        with pb_utils.context.model_context(context=self._bound_context):
            return call_is_ready(self.model, self.name, self._run_on_loop)

    def _run_on_loop(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._coroutine_loop()).result()

    def _start_is_ready(self) -> Future[Reason]:
        answer: Future[Reason] = Future()

        def run() -> None:
            try:
                answer.set_result(self.run_is_ready())
            except BaseException as exc:  # handed to whoever waits for it
                answer.set_exception(exc)

        threading.Thread(target=run, name=f"instance-ready:{self.name}", daemon=True).start()
        return answer

    # -- running calls on the instance thread -----------------------------------------------

    # An in-process instance lives as long as the server: it has no process to lose.
    alive = True

    def run_batch(self, batch: list[Pending], decoupled: bool) -> None:
        """Run `execute` for `batch`, on the instance thread.

        IsolatedInstance has the same method (and `alive`), so schedulers treat both alike.
        """
        run_execute(self, batch, decoupled)

    def post(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the instance thread, after the calls already queued."""
        self._calls.put(fn)

    def call(self, fn: Callable[[], Any], timeout: float | None = None) -> Any:
        """Run `fn` on the instance thread and wait for its result (or exception).

        Raises TimeoutError if `fn` has not finished after `timeout` seconds (None: no bound);
        it then still runs when the thread gets to it.
        """
        done = threading.Event()
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["value"] = fn()
            except BaseException as exc:  # handed back to the caller
                outcome["error"] = exc
            finally:
                done.set()

        self.post(run)
        if not done.wait(timeout):
            raise TimeoutError(f"{self.name}: no answer from the instance thread in {timeout}s")
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("value")

    def _run(self) -> None:
        cuda.use_instance_device(self.spec.kind, self.spec.device_id)
        bind_model_folders(self.spec.model_file)
        bound = pb_utils.context.ModelContext(
            self.spec.model_name, self.name, str(self.spec.model_file.parent), self.services
        )
        with pb_utils.context.model_context(context=bound):
            self._bound_context = bound
            while (fn := self._calls.get()) is not None:
                try:
                    fn()
                except BaseException:  # schedulers fail their batch; this keeps the thread
                    log.exception("%s: a call on the instance thread failed", self.name)
            self._bound_context = None
