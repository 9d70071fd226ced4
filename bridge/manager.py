"""The serving models and every change to them: load, zero-gap swap, unload, index.

One `ModelManager` owns the `LoadedRepository` (its `models` dict is the one live map of serving
models, changed in place, so in-process BLS callers find a swapped model by name) and one
`ModelWorker` per serving model.

A swap never leaves a gap: the new model is loaded beside the serving one (on a thread), served
on a new Dynamo component (generation 2, 3, ...) and registered; only then is the old one
unregistered. The old one keeps answering what was already routed to it, and is finalized after
`drain_grace` and its own drain (Model.close). A load that fails leaves the old one serving.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import tempfile
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynamo.runtime import DistributedRuntime

from model_repository_loader import repository
from model_repository_loader.config import ConfigOptions
from model_repository_loader.errors import ModelLoadError
from model_repository_loader.loader import (
    LoadedRepository,
    ModelStatus,
    PollError,
    load_model,
    load_model_with_config,
    override_source,
)
from model_repository_loader.model import Model

from . import heap
from .worker import ModelWorker

log = logging.getLogger("dynamo_bridge")

MODEL_CONTROL_MODES = ("none", "poll", "explicit")

# Triton's texts [V, 2.51].
NOT_EXPLICIT = "explicit model load / unload is not allowed if polling is enabled"
SERVER_NOT_READY = "Server not ready"


class ControlError(Exception):
    """A refused or failed load/unload; str() is Triton's message, `code` its status name."""

    def __init__(self, message: str, code: str = "INTERNAL") -> None:
        super().__init__(message)
        self.code = code


def poll_failed(name: str) -> ControlError:
    return ControlError(f"failed to load '{name}', failed to poll from model repository")


def digests_of(paths: Iterable[Path]) -> dict[str, str]:
    """content_digest of every model folder in the repositories (blocking: run on a thread)."""
    return {s.name: repository.content_digest(s.path) for s in repository.scan(list(paths))}


@dataclass
class ManagerOptions:
    repositories: list[Path]
    loader: ConfigOptions = field(default_factory=ConfigOptions)
    namespace: str = "dynamo_bridge"
    mode: str = "poll"
    # After unregistering a generation, how long it keeps answering what the frontend had
    # already routed to it before its requests are drained and it is finalized.
    drain_grace: float = 0.5
    # How long a new generation and the one it replaces serve side by side.
    swap_overlap: float = 0.3
    # The in-process frontend's metrics port: a newly loaded model is reported loaded only once
    # the frontend lists it (/v1/models), so "load returned" means "requests reach it", as in
    # Triton. None (no local frontend): not waited for.
    frontend_metrics_port: int | None = None


class ModelManager:
    """Loads, swaps and unloads models; serves each as a Dynamo worker (see module doc)."""

    def __init__(
        self, runtime: DistributedRuntime, options: ManagerOptions, loaded: LoadedRepository
    ) -> None:
        self.runtime = runtime
        self.options = options
        self.repository = loaded
        self.workers: dict[str, ModelWorker] = {}
        self.digests: dict[str, str] = {}
        self.ready = False  # set once start-up is over; the loading API refuses before
        self._generations: dict[str, int] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._retiring: set[asyncio.Task[None]] = set()
        self._override_dirs: dict[str, Path] = {}
        self._served: list[ModelWorker] = []  # every generation ever started
        self.loop = asyncio.get_running_loop()

    # -- start-up ------------------------------------------------------------------------------

    async def start(self, digests: dict[str, str]) -> None:
        """Serve every model the start-up load produced; `digests` as read before that load."""
        self.digests.update({n: d for n, d in digests.items() if n in self.repository.statuses})
        for model in list(self.repository.models.values()):
            await self._serve(model, announce=False)
        self.ready = True

    # -- changes -------------------------------------------------------------------------------

    async def load(
        self, name: str, config_json: str = "", files: dict[str, bytes] | None = None
    ) -> None:
        """Load (or reload, with no gap) `name`; raises ControlError with Triton's texts.

        `files` are written to a temporary folder of their own, removed when the load fails,
        when the model is unloaded or replaced, and at shutdown.
        """
        reason = repository.invalid_model_name(name)
        if reason is not None:
            raise ControlError(reason, "INVALID_ARG")
        if files and not config_json:
            log.error(
                "Poll failed for model directory '%s': Load parameter 'config' must be "
                "specified for model file override",
                name,
            )
            raise poll_failed(name)
        async with self._lock(name):
            root = Path(tempfile.mkdtemp(prefix="dynamo-bridge-override-")) if files else None
            serving = self.workers.get(name)
            try:
                if root is not None:
                    try:
                        source = await self._run(override_source, name, files, root)
                    except ModelLoadError as exc:
                        log.error("Poll failed for model directory '%s': %s", name, exc)
                        raise poll_failed(name) from None
                    digest = ""
                else:
                    source = await self._find(name)
                    if source is None:
                        raise poll_failed(name)
                    digest = await self._run(repository.content_digest, source.path)
                await self._load_source(source, digest, config_json)
            except BaseException:
                # Whatever failed (or was cancelled), remove the files unless they now serve.
                if self.workers.get(name) is not serving:
                    self._set_override_dir(name, root)
                elif root is not None:
                    shutil.rmtree(root, ignore_errors=True)
                raise
            self._set_override_dir(name, root)

    async def unload(self, name: str) -> None:
        """Stop serving `name`; returns once it is unregistered, finalizes it in the background.

        Unloading a model that is not loaded succeeds, as in Triton [V].
        """
        async with self._lock(name):
            model = self.repository.models.pop(name, None)
            worker = self.workers.pop(name, None)
            self._set_override_dir(name, None)
            if model is None:
                return
            self.repository.statuses[name] = ModelStatus(
                name, sorted(model.versions), ready=False, reason="unloaded"
            )
            await self._retire(worker, model)

    async def refresh(self, names: Iterable[str]) -> None:
        """Poll mode: bring `names` in line with the repository folders.

        A folder whose content digest is unchanged is left alone (a `touch` or an editor that
        rewrites the same bytes reloads nothing); a changed or new one is loaded, with no gap if
        it is serving; a vanished one is unregistered and finalized after draining. Failures are
        logged and leave the serving version in place.
        """
        sources = {s.name: s for s in await self._run(repository.scan, self.options.repositories)}
        for name in sorted(set(names)):
            async with self._lock(name):
                source = sources.get(name)
                if source is None:
                    await self._remove(name)
                    continue
                digest = await self._run(repository.content_digest, source.path)
                if self.digests.get(name) == digest:
                    log.debug("'%s': files touched, content unchanged; not reloading", name)
                    continue
                verb = "reloading" if name in self.repository.models else "loading"
                log.info("%s '%s': its files changed", verb, name)
                try:
                    await self._load_source(source, digest)
                except ControlError:
                    pass  # logged by _load_source; the next change is tried again

    # -- queries -------------------------------------------------------------------------------

    def is_model_ready(self, name: str, version: str = "") -> bool:
        model = self.repository.models.get(name)
        if model is None:
            return False
        if not version:
            return True
        try:
            return int(version) in model.versions
        except ValueError:
            return False

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Triton's repository index: every model folder; loaded or failed ones per version,
        with `state` (and `reason` when not ready); never-loaded ones by name only [V]."""
        names = {s.name for s in repository.scan(self.options.repositories)}
        names |= set(self.repository.models)  # loaded from `files=`, not in a repository
        entries: list[dict[str, str]] = []
        for name in sorted(names):
            status = self.repository.statuses.get(name)
            if status is None or not status.versions:
                if not ready_only:
                    entries.append({"name": name})
                continue
            if ready_only and not status.ready:
                continue
            for version in status.versions:
                entry = {"name": name, "version": str(version), "state": status.state}
                if not status.ready and status.reason:
                    entry["reason"] = status.reason
                entries.append(entry)
        return entries

    # -- shutdown ------------------------------------------------------------------------------

    async def close(self) -> None:
        """Unregister every model, let in-flight requests finish, finalize everything."""
        for worker in list(self.workers.values()):
            try:
                await worker.stop()
            except Exception as exc:  # keep shutting the rest down
                log.warning("unregistering '%s' failed: %s", worker.name, exc)
        self.workers.clear()
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)
        # Drain and finalize on a thread: finalize() is model code and may block.
        await self._run(self.repository.close)
        for name in list(self._override_dirs):
            self._set_override_dir(name, None)

    async def wait_served(self, timeout: float) -> None:
        """After runtime.shutdown(): let every generation's serve_endpoint call return, so the
        runtime does not call back into a closed event loop."""
        serving = [w._serving for w in self._served if w._serving is not None]
        if serving:
            await asyncio.wait(serving, timeout=timeout)

    # -- internals -----------------------------------------------------------------------------

    async def _load_source(
        self, source: repository.ModelSource, digest: str, config_json: str = ""
    ) -> None:
        name = source.name
        self.digests[name] = digest  # also on failure: an unchanged broken folder is not retried
        serving = name in self.repository.models
        try:
            if config_json:
                model = await self._run(
                    load_model_with_config, source, config_json, self.options.loader
                )
            else:
                model = await self._run(load_model, source, self.options.loader)
        except PollError as exc:
            log.error("Poll failed for model directory '%s': %s", name, exc)
            raise poll_failed(name) from None
        except ModelLoadError as exc:
            if exc.version is None:
                log.error("failed to load '%s' (%s): %s", name, source.path, exc)
                if not serving:
                    self.repository.statuses[name] = ModelStatus(name, [], False, str(exc))
                raise poll_failed(name) from None
            log.error(
                "failed to load '%s' version %d (%s): %s%s",
                name,
                exc.version,
                source.path,
                exc,
                "; the serving version stays" if serving else "",
            )
            if not serving:
                self.repository.statuses[name] = ModelStatus(name, [exc.version], False, str(exc))
            raise ControlError(
                f"load failed for model '{name}': version {exc.version} is at UNAVAILABLE "
                f"state: {exc};\n",
                "INVALID_ARG",
            ) from None
        await self._serve(model)

    async def _serve(self, model: Model, announce: bool = True) -> None:
        """Serve `model`, replacing (after it is registered) whatever served its name."""
        name = model.name
        generation = self._generations.get(name, 0) + 1
        self._generations[name] = generation
        worker = ModelWorker(
            self.runtime,
            self.options.namespace,
            model,
            generation,
            serving=lambda: self.repository.models.get(name),
        )
        self._served.append(worker)
        try:
            await worker.start()
        except Exception:
            # Not served: finalize it rather than leak its instances.
            await self._run(model.close)
            raise
        old_worker = self.workers.get(name)
        old_model = self.repository.models.get(name)
        self.workers[name] = worker
        self.repository.models[name] = model
        self.repository.statuses[name] = ModelStatus(name, sorted(model.versions), ready=True)
        if old_model is None and announce:
            await self._until_frontend_lists(name)
        if announce:
            log.info("successfully loaded '%s' (generation %d)", name, generation)
        if old_model is not None and old_model is not model:
            # Both generations serve for a moment: the frontend must have taken in the new
            # model card before the old one is withdrawn, or the name is briefly unknown.
            await asyncio.sleep(self.options.swap_overlap)
            await self._retire(old_worker, old_model)

    async def _remove(self, name: str) -> None:
        """A model folder is gone (poll mode): unregister and finalize it, forget it."""
        model = self.repository.models.pop(name, None)
        worker = self.workers.pop(name, None)
        self.repository.statuses.pop(name, None)
        self.digests.pop(name, None)
        if model is not None:
            log.info("'%s': its folder was removed; unloading", name)
            await self._retire(worker, model)

    async def _retire(self, worker: ModelWorker | None, model: Model) -> None:
        if worker is not None:
            try:
                await worker.stop()
            except Exception as exc:
                log.warning("unregistering '%s' failed: %s", model.name, exc)
        task = asyncio.ensure_future(self._finalize_later(worker, model))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _finalize_later(self, worker: ModelWorker | None, model: Model) -> None:
        # Requests the frontend routed here just before the unregister still arrive for a
        # moment; they find the model alive. Then its queue is drained and it is finalized.
        await asyncio.sleep(self.options.drain_grace)
        await self._run(model.close)
        if worker is not None:
            await worker.withdraw()
        heap.refreeze()  # the unloaded generation may be frozen (heap.py)
        generation = f" (generation {worker.generation})" if worker is not None else ""
        log.info("successfully unloaded '%s'%s", model.name, generation)

    async def _until_frontend_lists(self, name: str, timeout: float = 5.0) -> None:
        port = self.options.frontend_metrics_port
        if port is None:
            return
        needle = b'"id":' + json.dumps(name).encode()
        deadline = self.loop.time() + timeout
        while self.loop.time() < deadline:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(
                    b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
                )
                body = await asyncio.wait_for(reader.read(), 1.0)
                writer.close()
                if needle in body.replace(b" ", b""):
                    return
            except (OSError, asyncio.TimeoutError):
                pass
            await asyncio.sleep(0.005)
        log.warning("'%s' registered but not listed by the frontend after %.0fs", name, timeout)

    async def _find(self, name: str) -> repository.ModelSource | None:
        sources = await self._run(repository.scan, self.options.repositories)
        return next((s for s in sources if s.name == name), None)

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    def _set_override_dir(self, name: str, path: Path | None) -> None:
        old = self._override_dirs.pop(name, None)
        if old is not None and old != path:
            shutil.rmtree(old, ignore_errors=True)
        if path is not None:
            self._override_dirs[name] = path

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await self.loop.run_in_executor(None, fn, *args)


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
            raise ControlError(SERVER_NOT_READY, "UNAVAILABLE")
        return self.manager

    def _call(self, coroutine_fn: Any, *args: Any) -> None:
        manager = self._ready_manager()
        if self.mode != "explicit":
            raise ControlError(NOT_EXPLICIT, "UNAVAILABLE")
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
