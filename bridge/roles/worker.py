"""The worker side of a bridge process: a repository's models served as Dynamo endpoints.

Start-up follows Triton: the models of the start-up set (all of them, or the `--load-model` ones
in explicit mode) are loaded first and a status table is printed; a model that fails to load is
reported and skipped unless `--exit-on-error`. Then, by `--model-control-mode`: `poll` watches the
repositories and swaps changed models with no gap (reload.py, manager.py), `explicit` takes
load/unload from the repository API (`--control-port`, the triton door; over the control
endpoint) and `pb_utils.load_model`, `none` serves what loaded. All of it works the same whether
a frontend runs in this process (`--role all`) or elsewhere (`--role worker`).

Health: readiness is Triton's strict one (every model the server tried to load is ready, not
while starting or stopping). It answers the metrics port's `/v2/health/ready`, and is mirrored to
Dynamo's system status server (`DYN_SYSTEM_PORT`, `/health`) with `rt.set_health_status`, which
Dynamo answers 503 until told otherwise (spec dynamo_runtime.md §8).

Graceful stop (`close`): every generation of every model is withdrawn from discovery first
(model card, then, once no request arrives any more, the instance record), so frontends route to
other replicas; in-flight requests then finish and every instance's `finalize()` runs, all within
`--exit-timeout-secs`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable

from dynamo.runtime import DistributedRuntime

from model_repository_loader import repository
from model_repository_loader.loader import LoadedRepository, ModelStatus, load_repository
from model_repository_loader.response_cache import ResponseCache
from model_repository_loader.scheduling.rate_limiter import RateLimiter

from ..cluster.control_endpoint import ControlEndpoint
from ..cluster.index import ClusterIndex
from ..cluster.remote_models import DynamoRemoteModels
from ..dynamo_endpoints import dynamo_endpoint
from ..metrics.triton import TritonMetrics
from ..models import ModelControl, ModelManager, digests_of
from ..options import ServerOptions, StartupError
from ..reload import RepositoryWatcher
from ..status_table import format_status_table
from ..transport.shm_regions import Sweeper

log = logging.getLogger("dynamo_bridge")

# How often Dynamo's health status is brought in line with the strict readiness: often enough
# that a probe sees a change within a quarter second, and a check is a few dict reads.
HEALTH_SYNC_S = 0.25
# The never-served endpoint whose metrics callback appends ours to the system status server's
# /metrics: a callback registered on an endpoint that is served later is lost (measured on
# 1.6.1), and model endpoints come and go with reloads.
METRICS_ENDPOINT = "bridge.metrics"


class WorkerRole:
    """Loads the repository, serves its models, keeps them in line with it; see module doc."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.control = ModelControl(options.model_control_mode)
        self.manager: ModelManager | None = None
        self._loaded: LoadedRepository | None = None
        self._digests: dict[str, str] = {}
        self._watcher: RepositoryWatcher | None = None
        self._health: asyncio.Task[None] | None = None
        self._regions = Sweeper()  # bridge/transport/shm_regions.py
        self._stopping = False
        self._sources: list[Callable[[], str]] = []
        # Whether discovery works (the composition root's DiscoveryWatch, roles/discovery.py).
        self.discovery_usable: Callable[[], bool] = lambda: True

    # -- start-up ------------------------------------------------------------------------------

    async def load(self) -> None:
        """Load the start-up set and print the status table; StartupError if it must not
        serve (`--exit-on-error` and a model failed)."""
        loop = asyncio.get_running_loop()
        if self.options.model_control_mode == "poll":
            # A .pyc written now and an edit of the same size within the same second would make
            # the next import run the old code; without caches every reload compiles what is on
            # disk.
            sys.dont_write_bytecode = True
        self._digests, loaded = await loop.run_in_executor(None, self._initial_load)
        serving = not (self.options.exit_on_error and loaded.failures)
        print(format_status_table(loaded.statuses.values(), serving), flush=True)
        if not serving:
            loaded.close()
            raise StartupError("failed to load all models")
        self._loaded = loaded

    async def start(
        self,
        runtime: DistributedRuntime,
        index: ClusterIndex,
        confirm_listed: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        """Serve the loaded models on `runtime`, then the watcher and the control port.

        `index`: the process's one ClusterIndex (started by the composition root), through
        which BLS calls find the models other processes serve.

        `confirm_listed`: awaited before a newly loaded generation replaces the one serving
        (the composition root picks it): the in-process Dynamo frontend's confirmation that it
        lists the model; `grace_for_other_doors` when doors in other processes route here and
        cannot be asked; None when nothing needs to be waited for (the only door is the triton
        door in this process, whose directory is told in-process at once).
        """
        options = self.options
        assert self._loaded is not None, "load() first"
        mode = options.model_control_mode
        manager = self.manager = ModelManager(runtime, options, self._loaded, confirm_listed)
        self.control.manager = manager
        triton = TritonMetrics(
            lambda: manager.repository.models, options.metrics_config, manager.repository.cache
        )
        self._sources = [triton.render, manager.repository.metrics.render_prometheus]
        # What crosses processes is built here (bridge/cluster/), not by the manager: the
        # control endpoint other bridge processes find these models through, and the models
        # other processes serve (none with `mem` discovery: this process is alone).
        control = ControlEndpoint(runtime, options.namespace, manager)
        # Frees the shared memory regions a door on this host left when it died.
        self._regions.start()
        remote = (
            DynamoRemoteModels(index, asyncio.get_running_loop(), control.worker)
            if options.discovery_backend != "mem"
            else None
        )
        await manager.start(self._digests, control.start, remote)

        if mode == "poll":
            self._watcher = RepositoryWatcher(
                options.model_repositories, manager.refresh, debounce=options.reload_debounce
            )
            try:
                self._watcher.start()
            except OSError as exc:  # e.g. the inotify instance limit: serve on, without reloads
                log.error("cannot watch the model repositories, hot reload is off: %s", exc)
                self._watcher = None
            else:
                # Anything changed while the models were loading (digests were read before).
                names = set(self._digests)
                names |= {s.name for s in repository.scan(options.model_repositories)}
                asyncio.ensure_future(manager.refresh(names, retry_failed=False))
        if mode == "explicit" and options.control_port is None and options.door is None:
            log.warning(
                "explicit model control without --control-port: models load at run time only "
                "through pb_utils.load_model"
            )
        # Dynamo's system status server (DYN_SYSTEM_PORT): our metrics on its /metrics, and
        # its /health following our readiness.
        if options.allow_metrics:
            metrics = dynamo_endpoint(runtime, f"{options.namespace}.{METRICS_ENDPOINT}").metrics
            metrics.register_prometheus_expfmt_callback(self._render_for_dynamo)
        self._health = asyncio.ensure_future(self._sync_health(runtime))

    async def grace_for_other_doors(self, name: str) -> None:
        """What a door in another process is given to pick up a new generation of `name`."""
        # Measured with file discovery: withdrawing the old generation at once made a frontend
        # answer NOT_FOUND for a moment.
        await asyncio.sleep(self.options.timings.remote_frontend_grace_secs)

    def _initial_load(self) -> tuple[dict[str, str], LoadedRepository]:
        options = self.options
        only = _startup_set(options)
        # Digests first: a file saved while the models load then differs from its digest, and
        # the refresh after start-up picks it up.
        digests = digests_of(options.model_repositories)
        cache = (
            ResponseCache(options.response_cache_bytes) if options.response_cache_bytes else None
        )
        loaded = LoadedRepository(cache=cache)
        if options.rate_limit == "execution_count":
            loaded.rate_limiter = RateLimiter(options.rate_limit_resources)
        # The models' loading API: "Server not ready" until start-up is over, as in Triton.
        loaded.services.control = self.control
        loaded = load_repository(options.model_repositories, options.loader, only, into=loaded)
        for name in sorted((only or set()) - set(loaded.statuses)):
            reason = f"failed to load '{name}', failed to poll from model repository"
            log.error("%s", reason)
            loaded.statuses[name] = ModelStatus(name, [], False, reason)
        return digests, loaded

    # -- what the process serves about it ------------------------------------------------------

    def ready(self) -> bool:
        """Triton's strict readiness (its default): not while starting or stopping, and not
        while a model it tried to load is not ready, whether it failed or was unloaded
        [V on 2.51]. Nor while discovery does not work (etcd unreachable, lease lost). With
        --strict-readiness false, only the first and the last."""
        manager = self.manager
        return (
            manager is not None
            and manager.ready
            and not self._stopping
            and self.discovery_usable()
            and (
                not self.options.strict_readiness
                or all(status.ready for status in manager.repository.statuses.values())
            )
        )

    def metrics_sources(self) -> list[Callable[[], str]]:
        """Prometheus text sources (after start()): Triton's `nv_inference_*` families and the
        models' custom metrics."""
        return list(self._sources)

    def _render_for_dynamo(self) -> str:
        # Called by Dynamo at each scrape of its /metrics, off the event loop: a model map
        # changing meanwhile must cost this scrape our part, never the whole scrape.
        try:
            return "".join(_ended(source()) for source in self._sources)
        except Exception as exc:
            log.debug("metrics for the system status server: %r", exc)
            return ""

    async def _sync_health(self, runtime: DistributedRuntime) -> None:
        reported: bool | None = None
        while True:
            ready = self.ready()
            if ready != reported:
                runtime.set_health_status(ready)
                reported = ready
            await asyncio.sleep(HEALTH_SYNC_S)

    # -- shutdown ------------------------------------------------------------------------------

    async def close(
        self, runtime: DistributedRuntime, timeout: float, withdraw: bool = True
    ) -> bool:
        """Withdraw every model from discovery (unless the runtime is already gone:
        `withdraw=False`), drain, finalize; within `timeout` seconds. False if that bound was
        hit (threads stuck in model code must not be waited for)."""
        self._stopping = True
        if self._health is not None:
            self._health.cancel()
        self._regions.stop()
        runtime.set_health_status(False)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self._watcher is not None:
            await self._watcher.stop()
        clean = True
        if self.manager is not None:
            clean = await self.manager.close(
                timeout=max(0.0, deadline - loop.time()), withdraw=withdraw
            )
            self.manager.repository.services.control = None
        return clean

    async def wait_served(self, timeout: float) -> None:
        """After runtime.shutdown(): let every endpoint's serve call return."""
        if self.manager is not None:
            await self.manager.wait_served(timeout)


def _ended(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


def _startup_set(options: ServerOptions) -> set[str] | None:
    """The models to load at start-up; None = all."""
    if options.model_control_mode != "explicit":
        if options.load_models:
            log.warning("--load-model is only used with --model-control-mode=explicit")
        return None
    if "*" in options.load_models:
        return None
    return set(options.load_models)
