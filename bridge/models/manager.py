"""The serving models and every change to them: load, zero-gap swap, unload, index.

One `ModelManager` owns the `LoadedRepository` (its `models` dict is the one live map of serving
models, changed in place, so in-process BLS callers find a swapped model by name) and one
`ModelWorker` per serving model.

A swap never leaves a gap: the new model is loaded beside the serving one (on a thread of its
own), served on a new Dynamo component (generation 2, 3, ...) and registered; once discovery
shows its instance and the front door confirms it lists the name (`confirm_listed`, given by the
role that knows the door), the old one is retired (`ModelWorker.retire`, one call): unregistered
at once, and a request that still reaches the old endpoint goes to the model now serving the
name; withdrawn once it is quiet (no request in flight, none arriving for `route_quiet_secs`;
bounded by `drain_timeout_secs`). Then it is closed (drained and finalized, bounded by
`close_timeout_secs`) and dropped from every structure here. A load that fails leaves the old
one serving. Every wait is one of the server's `Timings` (bridge/options.py, DYN_BRIDGE_*).

Whoever routes to this process's models from inside it (the triton door's directory) is told of
every change at once (`listeners`): a new generation serving a name, a name unloaded or removed.
It need not poll, and so never sends a request to a generation already withdrawn.

Each model changes on its own: one model's load that never returns holds only that model's lock,
and is logged while it lasts ("still loading ..."); other models keep reloading.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from dynamo.runtime import DistributedRuntime

from model_repository_loader import repository
from model_repository_loader.composition import RemoteModels
from model_repository_loader.composition.loading import missing_steps_text
from model_repository_loader.errors import ModelLoadError
from model_repository_loader.loader import (
    LoadedRepository,
    ModelStatus,
    PollError,
    load_model,
    load_model_with_config,
    override_source,
)
from model_repository_loader.model import ServedModel
from model_repository_loader.pb_utils.errors import ErrorCode

from .. import heap
from ..options import ServerOptions
from ..tuning import release_free_memory
from .endpoint import ModelWorker
from .errors import NOT_EXPLICIT, ControlError, poll_failed
from .threads import on_daemon_thread

log = logging.getLogger("dynamo_bridge")

MODEL_CONTROL_MODES = ("none", "poll", "explicit")


# After the last unload of a burst, when the heap is collected and frozen again: long enough
# that a burst of unloads (a `git checkout`, a folder removed) costs one full collection, short
# enough that the memory is given back before anyone looks.
REFREEZE_DELAY = 1.0
# How much longer than its own bound a model's close is waited for before it is abandoned on
# its thread: the close answers what it could not finish within the bound, which takes a moment.
CLOSE_BACKSTOP_S = 5.0


def digests_of(paths: Iterable[Path]) -> dict[str, str]:
    """content_digest of every model folder in the repositories (blocking: run on a thread)."""
    return {s.name: repository.content_digest(s.path) for s in repository.scan(list(paths))}


class StartableRemoteModels(RemoteModels, Protocol):
    """The models other processes serve (bridge/cluster/remote_models.py), started once."""

    async def start(self) -> None: ...


class ModelManager:
    """Loads, swaps and unloads models; serves each as a Dynamo worker (see module doc)."""

    def __init__(
        self,
        runtime: DistributedRuntime,
        options: ServerOptions,
        loaded: LoadedRepository,
        confirm_listed: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self.runtime = runtime
        self.options = options
        # Awaited after a new generation is registered, before the one it replaces is retired
        # and before a load returns: returns once the front doors route the name to it (the role
        # knows how to tell; None: nothing to wait for). It only waits, it never raises.
        self._confirm_listed = confirm_listed
        self.repository = loaded
        self.workers: dict[str, ModelWorker] = {}
        self.digests: dict[str, str] = {}
        self.ready = False  # set once start-up is over; the loading API refuses before
        self._generations: dict[str, int] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._retiring: set[asyncio.Task[None]] = set()
        self._refreshing: set[asyncio.Task[None]] = set()
        self._override_dirs: dict[str, Path] = {}
        # Digest of the last failed load per model: the start-up refresh does not retry it.
        self._failed_digests: dict[str, str] = {}
        # serve_endpoint calls of every generation started (the workers leave them here):
        # Dynamo keeps serving a retired endpoint (no per-endpoint stop), and wait_served lets
        # each return at shutdown. Only the futures are kept; a retired worker lets go of its
        # model (ModelWorker.retire).
        self._serve_calls: list[asyncio.Future[Any]] = []
        self._refreeze: asyncio.TimerHandle | None = None
        # Called on the loop with a model's name as soon as what serves it changed (see the
        # module doc); before a load or unload returns, before an old generation is withdrawn.
        self.listeners: list[Callable[[str], None]] = []
        self.loop = asyncio.get_running_loop()

    # -- start-up ------------------------------------------------------------------------------

    async def start(
        self,
        digests: dict[str, str],
        serve_control: Callable[[], asyncio.Future[Any]] | None = None,
        remote: StartableRemoteModels | None = None,
    ) -> None:
        """Serve every model the start-up load produced; `digests` as read before that load.

        The role hands in what crosses processes (bridge/cluster/): `serve_control` starts the
        endpoint through which other bridge processes (a door, BLS callers) find these models,
        once they are served; `remote` reaches the models other processes serve (None: `mem`
        discovery, no other process), for BLS calls and ensemble steps.
        """
        for name, digest in digests.items():
            if name in self.repository.models:
                self.digests[name] = digest
            elif name in self.repository.statuses:
                self._failed_digests[name] = digest
        for model in list(self.repository.models.values()):
            await self._serve(model, announce=False)
        if serve_control is not None:
            self._serve_calls.append(serve_control())
        if remote is not None:
            await remote.start()
            self.repository.scope.remote = remote
            await self._load_remote_ensembles()
        self.ready = True

    @property
    def repositories(self) -> list[Path]:
        return list(self.options.model_repositories)

    def refuse_unless_explicit(self) -> None:
        """ControlError (Triton's text) unless load and unload requests are taken from outside
        (`--model-control-mode=explicit`)."""
        if self.options.model_control_mode != "explicit":
            raise ControlError(NOT_EXPLICIT, ErrorCode.UNAVAILABLE)

    async def _load_remote_ensembles(self) -> None:
        """Load again the ensembles the start-up load refused for a composing model it did not
        find: that load ran before this process could see other processes' models (the
        runtime did not exist yet), and those may serve the missing steps."""
        for name, status in list(self.repository.statuses.items()):
            if status.ready or not status.reason.startswith(missing_steps_text(name, [])):
                continue
            source = await self._find(name)
            if source is None:
                continue
            try:
                digest = await self._run(repository.content_digest, source.path)
                model = await self._on_thread(
                    load_model, source, self.options.loader, self.repository
                )
            except ModelLoadError as exc:
                log.debug("'%s' still cannot load: %s", name, exc)
                continue
            await self._serve(model, announce=False)
            self.digests[name] = digest
            self._failed_digests.pop(name, None)
            log.info("successfully loaded '%s': other processes serve its composing models", name)

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
            raise ControlError(reason, ErrorCode.INVALID_ARG)
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
            self._changed(name)
            await self._retire(worker, model)

    async def refresh(self, names: Iterable[str], retry_failed: bool = True) -> None:
        """Poll mode: bring `names` in line with the repository folders.

        A folder whose content digest is unchanged since its last successful load is left alone
        (a `touch` or an editor that rewrites the same bytes reloads nothing); a changed or new
        one is loaded, with no gap if it is serving; a vanished one is unregistered and
        finalized after draining. A folder whose last load failed is tried again on any event
        for it (a transient failure is not stuck until the files change), unless
        `retry_failed` is false (the refresh right after start-up). Every model is refreshed
        on its own task: one that hangs delays nobody else. Failures are logged and leave the
        serving version in place.
        """
        sources = {
            s.name: s for s in await self._run(repository.scan, self.options.model_repositories)
        }
        tasks = []
        for name in sorted(set(names)):
            task = asyncio.ensure_future(self._refresh_one(name, retry_failed, sources))
            self._refreshing.add(task)
            task.add_done_callback(self._refreshing.discard)
            tasks.append(task)
        if tasks:
            await asyncio.wait(tasks)

    async def _refresh_one(
        self, name: str, retry_failed: bool, sources: dict[str, repository.ModelSource]
    ) -> None:
        try:
            lock = self._lock(name)
            waited = lock.locked()
            async with lock:
                # A refresh that waited behind a slow load looks at the folder as it is now.
                source = await self._find(name) if waited else sources.get(name)
                if source is None:
                    await self._remove(name)
                    return
                digest = await self._run(repository.content_digest, source.path)
                if self.digests.get(name) == digest and name in self.repository.models:
                    log.debug("'%s': files touched, content unchanged; not reloading", name)
                    return
                if not retry_failed and self._failed_digests.get(name) == digest:
                    return  # failed at start-up with these very files; logged then
                verb = "reloading" if name in self.repository.models else "loading"
                log.info("%s '%s': its files changed", verb, name)
                try:
                    await self._load_source(source, digest)
                except ControlError:
                    self._failed_digests[name] = digest  # logged by _load_source
                except Exception:
                    self._failed_digests[name] = digest
                    log.exception("reloading '%s' failed; the serving version stays", name)
        except Exception:  # the folder could not be read, unregistering failed...
            log.exception("refreshing '%s' failed", name)

    # -- queries -------------------------------------------------------------------------------

    def local_worker(self, path: str) -> ModelWorker | None:
        """The worker serving the endpoint `path` now, if it is one of this process's (the
        in-process door's route, bridge/frontends/triton/routes.py); None for a retired
        generation or an endpoint served elsewhere."""
        for worker in self.workers.values():
            if worker.path == path:
                return worker
        return None

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

    # -- shutdown ------------------------------------------------------------------------------

    async def close(self, timeout: float, withdraw: bool = True) -> bool:
        """Withdraw every model from discovery, let in-flight requests finish, finalize
        everything; within `timeout` seconds in all. False if that bound was hit (a model's
        execute or finalize, or a load, is stuck on its thread): the caller must not wait for
        those threads. `withdraw=False`: Dynamo already shut the runtime down (a lost etcd
        lease, bridge/roles/discovery.py): nothing is routed here and there is nothing to
        withdraw from.

        Withdrawing is the reload's retire, for every serving generation at once: the model
        cards go first, and frontends (here or in other processes) stop routing here and use
        the other replicas; once no request has arrived for `route_quiet_secs`, the instance records
        go too, then the models close, draining what is in flight. Removing an instance record
        while a frontend may still route to it fails those requests ("Worker disconnected
        before response stream was established", measured: 4 to 12 of ~5000 requests at
        concurrency 16 when both went at once; none in this order).
        """
        deadline = self.loop.time() + timeout
        for task in list(self._refreshing):
            task.cancel()  # a load in progress is abandoned; its thread is not waited for
        workers = list(self.workers.values()) if withdraw else []
        self.workers.clear()
        # Requests in flight are not waited for before the instance records go (drain=False):
        # closing the models drains them.
        timings = self.options.timings
        quiet_until = min(deadline, self.loop.time() + timings.routes_quiet_max_secs)
        withdrawn = []
        for worker in workers:
            bound = max(0.0, quiet_until - self.loop.time())
            withdrawn.append(await worker.retire(timings.route_quiet_secs, bound, drain=False))
        if withdrawn:
            await asyncio.wait(withdrawn)
        if self._refreeze is not None:
            self._refreeze.cancel()
        pending = set(self._retiring)
        # Drain and finalize on threads of their own: finalize() is model code and may block.
        # The repository bounds its own close; the wait here is the backstop.
        closing = self._on_thread(self.repository.close, max(0.0, deadline - self.loop.time()))
        done, not_done = await asyncio.wait(
            pending | {closing}, timeout=max(0.0, deadline - self.loop.time())
        )
        for name in list(self._override_dirs):
            self._set_override_dir(name, None)
        self.repository.scope.remote = None  # the runtime stops next
        # The repository's own bound may end the close first: it then returns False.
        abandoned = closing in done and closing.exception() is None and closing.result() is False
        if not_done or abandoned:
            log.error(
                "shutdown: models still draining or finalizing after %.0f s "
                "(--exit-timeout-secs); not waiting for them",
                timeout,
            )
            return False
        return True

    async def wait_served(self, timeout: float) -> None:
        """After runtime.shutdown(): let every generation's serve_endpoint call return, so the
        runtime does not call back into a closed event loop."""
        if self._serve_calls:
            await asyncio.wait(self._serve_calls, timeout=timeout)

    # -- internals -----------------------------------------------------------------------------

    async def _load_source(
        self, source: repository.ModelSource, digest: str, config_json: str = ""
    ) -> None:
        name = source.name
        serving = name in self.repository.models
        try:
            if config_json:
                loading = self._on_thread(
                    load_model_with_config,
                    source,
                    config_json,
                    self.options.loader,
                    self.repository,
                )
            else:
                loading = self._on_thread(load_model, source, self.options.loader, self.repository)
            model = await self._logged_while_slow(loading, name)
        except PollError as exc:
            log.error("Poll failed for model directory '%s': %s", name, exc)
            if not serving and not config_json:
                self.repository.statuses[name] = ModelStatus(name, [], False, str(exc))
            raise poll_failed(name) from None
        except ModelLoadError as exc:
            if exc.version is None:
                # Past the poll, the model as a whole failed (no version under the policy, an
                # ensemble's steps): INVALID_ARG with the reason, as Triton answers [V].
                log.error("failed to load '%s' (%s): %s", name, source.path, exc)
                if not serving:
                    self.repository.statuses[name] = ModelStatus(name, [], False, str(exc))
                message = f"load failed for model '{name}': {exc}\n"
                raise ControlError(message, ErrorCode.INVALID_ARG) from None
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
                ErrorCode.INVALID_ARG,
            ) from None
        await self._serve(model)
        # Only now: a load that failed (even for a passing reason) is tried again on the next
        # event for the folder, not skipped as unchanged.
        self.digests[name] = digest
        self._failed_digests.pop(name, None)

    async def _logged_while_slow(self, loading: asyncio.Future[Any], name: str) -> Any:
        """Await a load; while it runs past `slow_load_warning_secs`, say so (at each doubling)."""
        waited = 0.0
        step = self.options.timings.slow_load_warning_secs
        while True:
            done, _ = await asyncio.wait({loading}, timeout=step)
            if done:
                return loading.result()
            waited += step
            log.warning("still loading '%s' after %.0f s", name, waited)
            step = waited

    async def _serve(self, model: ServedModel, announce: bool = True) -> None:
        """Serve `model`, replacing (after it is registered) whatever served its name."""
        name = model.name
        generation = self._generations.get(name, 0) + 1
        self._generations[name] = generation
        models = self.repository.models
        worker = ModelWorker(
            self.runtime,
            self.options.namespace,
            model,
            generation,
            serving=lambda: models.get(name),  # the name's live model: never a retired one
            bytes_limits=self.options.bytes_limits,
            serve_calls=self._serve_calls,
        )
        try:
            await worker.start()
        except Exception:
            # Not served: finalize it rather than leak its instances.
            await self._close_bounded(model)
            raise
        old_worker = self.workers.get(name)
        old_model = self.repository.models.get(name)
        self.workers[name] = worker
        self.repository.models[name] = model
        self.repository.statuses[name] = ModelStatus(name, sorted(model.versions), ready=True)
        self._changed(name)
        # At start-up the start-up load's model is already in the map (old_model is model) and
        # the frontend is not running yet: nothing to confirm, nothing to retire.
        replacing = old_model is not None and old_model is not model
        if announce or replacing:
            # Confirmations before the old generation is withdrawn: discovery shows the new
            # generation's instance (start() waited for it) and the front doors list the name.
            if self._confirm_listed is not None:
                await self._confirm_listed(name)
        if announce:
            log.info("successfully loaded '%s' (generation %d)", name, generation)
        if replacing and old_model is not None:
            await self._retire(old_worker, old_model)

    async def _remove(self, name: str) -> None:
        """A model folder is gone (poll mode): unregister and finalize it, forget it."""
        model = self.repository.models.pop(name, None)
        worker = self.workers.pop(name, None)
        self.repository.statuses.pop(name, None)
        self.digests.pop(name, None)
        if model is not None:
            log.info("'%s': its folder was removed; unloading", name)
            self._changed(name)
            await self._retire(worker, model)

    def _changed(self, name: str) -> None:
        for listener in self.listeners:
            try:
                listener(name)
            except Exception:  # a listener's bug must not stop a load or unload half-way
                log.exception("telling a listener that '%s' changed failed", name)

    async def _retire(self, worker: ModelWorker | None, model: ServedModel) -> None:
        """Unregister a generation now; withdraw, close and forget it in the background."""
        withdrawn = None
        if worker is not None:
            timings = self.options.timings
            withdrawn = await worker.retire(timings.route_quiet_secs, timings.drain_timeout_secs)
        generation = f" (generation {worker.generation})" if worker is not None else ""
        task = asyncio.ensure_future(self._finalize(withdrawn, model, generation))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _finalize(
        self, withdrawn: asyncio.Future[None] | None, model: ServedModel, generation: str
    ) -> None:
        """Once the retired generation is withdrawn (and has let go of its model): close the
        model, and forget it."""
        name = model.name
        if withdrawn is not None:
            await asyncio.wait({withdrawn})  # whatever became of it, the model still closes
        await self._close_bounded(model)
        del model, withdrawn  # nothing here may keep the generation alive past this point
        self._schedule_refreeze()
        log.info("successfully unloaded '%s'%s", name, generation)

    async def _close_bounded(self, model: ServedModel) -> None:
        """model.close() (drain, then finalize) on a thread of its own, waited for at most
        `close_timeout_secs`: a finalize that never returns keeps only its thread."""
        # The model bounds its own close (answering what it could not finish UNAVAILABLE); the
        # wait here is the backstop for one that overruns it anyway.
        timeout = self.options.timings.close_timeout_secs
        closing = self._on_thread(model.close, timeout)
        done, _ = await asyncio.wait({closing}, timeout=timeout + CLOSE_BACKSTOP_S)
        if not done:
            log.error(
                "'%s': finalize still running after %.0f s; not waiting for it",
                model.name,
                timeout,
            )
        elif closing.exception() is not None:
            log.error("'%s': closing failed: %s", model.name, closing.exception())

    def _schedule_refreeze(self) -> None:
        """One heap.refreeze() and release of free memory shortly after a burst of unloads, not
        one per unload: the collection is a full one, on the loop's thread whatever thread runs
        it (the GIL)."""
        if self._refreeze is None:
            self._refreeze = self.loop.call_later(REFREEZE_DELAY, self._run_refreeze)

    def _run_refreeze(self) -> None:
        self._refreeze = None
        heap.refreeze()  # the unloaded generations may be frozen (heap.py)
        # What they held is free now, but malloc keeps it in its arenas (tuning.py).
        self.loop.run_in_executor(None, release_free_memory)

    async def _find(self, name: str) -> repository.ModelSource | None:
        sources = await self._run(repository.scan, self.options.model_repositories)
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

    def _on_thread(self, fn: Any, *args: Any) -> asyncio.Future[Any]:
        return on_daemon_thread(self.loop, fn, *args)
