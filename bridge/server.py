"""Composition root: the roles of this process (bridge/roles/) on one Dynamo runtime.

`--role all` (the embedded default) runs a worker (bridge/roles/worker.py: the repository's
models, hot reload, the control port) and a front door (the triton door,
bridge/roles/triton_door.py, by default; Dynamo's KServe gRPC frontend,
bridge/roles/frontend.py, with `--frontend dynamo`) in one process over `mem` discovery;
`--role worker` and `--role frontend` run one of them, and find each other through Dynamo's
discovery (docs/deployment.md). Before anything slow, the services the runtime needs (etcd,
NATS) must answer (bridge/roles/runtime.py) and every port must be free
(bridge/roles/ports.py); the metrics and control ports are bound, and the door's checked again,
before any model is registered, so a failed start-up leaves nothing registered.

The metrics port (`--metrics-port`, bridge/metrics/) serves what the process has: Triton's
`nv_inference_*` metrics and the models' custom metrics (worker), Dynamo's frontend metrics and
its `/health` and `/live` passed through from the frontend's own HTTP port (frontend), and
Triton's `/v2/health/live` and `/v2/health/ready`.

Shutdown (SIGINT/SIGTERM) withdraws every model from discovery, lets in-flight requests finish,
runs every instance's `finalize()`, and only then stops the runtime, all within
`--exit-timeout-secs` as tritonserver does: past it (an `execute`, `finalize` or reload's
`initialize` that never returns) the process flushes its logs and exits with status 1 without
waiting for those threads. A second SIGINT/SIGTERM exits at once.

With etcd discovery (bridge/roles/discovery.py) every readiness is false while etcd does not
answer, and a runtime Dynamo shuts down under the process (its lease lost) stops it the same way,
with status 1, so that whatever supervises it starts it again with a new lease.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import NoReturn

from . import heap
from .cluster.index import ClusterIndex
from .control import ControlPort
from .frontends.triton.grpc.server import LEAST_CONNECTIONS
from .frontends.triton.http.server import HttpConfigError
from .logs import dynamo_noise
from .metrics.gpu import GpuMetrics
from .metrics.server import MetricsServer
from .models.endpoint import ModelWorker
from .options import ServerOptions, StartupError
from .roles.discovery import DiscoveryWatch, back_off_before_reexec
from .roles.frontend import FrontendRole
from .roles.ports import PortUnavailable, check_free, door_listeners, listeners
from .roles.runtime import RuntimeSettingsError, check_services, start_runtime
from .roles.triton_door import TritonDoorRole
from .roles.worker import WorkerRole
from .transport.arrival import set_caller_timeout
from .tuning import (
    batch_scheduling,
    keep_large_buffers,
    open_files_to_hard_limit,
    request_plane_timeout,
)

__all__ = ["RuntimeSettingsError", "ServerOptions", "StartupError", "serve"]

log = logging.getLogger("dynamo_bridge")


def _exit_now(status: int) -> NoReturn:
    """Leave the process at once (threads stuck in model code are not joined); logs first."""
    try:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        dynamo_noise.close()
    finally:
        os._exit(status)


def _reexec() -> NoReturn:
    """This process, started again from its own command line: same pid, arguments and
    environment; threads, sockets and models are gone (Python opens its descriptors
    non-inheritable), stdio stays."""
    try:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        dynamo_noise.close()  # fd 2 back to the real output before the new image writes to it
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    finally:
        os._exit(1)  # execv failed (it does not return otherwise)


def _second_signal() -> None:
    log.warning("second signal: exiting now, without waiting for models to finish")
    _exit_now(1)


def _arm_exit_watchdog(seconds: float) -> threading.Timer:
    """The last resort if shutdown itself stalls past its bound (the event loop included)."""

    def expired() -> None:
        log.error(EXIT_TIMEOUT_TEXT)
        _exit_now(1)

    timer = threading.Timer(seconds, expired)
    timer.daemon = True
    timer.start()
    return timer


EXIT_TIMEOUT_TEXT = "exit timeout expired: exiting without waiting for the models still running"
# Past --exit-timeout-secs: what stopping the runtime and the frontend may still take (measured
# well under a second; the watchdog only fires when something hangs).
RUNTIME_STOP_S = 5.0
# After the models closed: for the last responses to leave through the request plane before the
# runtime stops under them (a fraction of a second is ample for what is already on its way).
LAST_RESPONSES_S = 0.2
# After runtime.shutdown(): for every endpoint's serve call to return (they return as the
# runtime stops; this bounds one that does not, so the exit is never held by it).
SERVE_CALLS_RETURN_S = 2.0
# When the front door stopped by itself: how long discovery's watch may take to tell whether
# the runtime was shut down under it (a lost etcd lease), which decides the exit status.
LEASE_SETTLE_S = 2.0


def _worker_metrics(worker: WorkerRole) -> Callable[[], str]:
    """The worker's metrics text at each scrape: its sources exist once it has started, and
    the metrics port starts before it (bound before any model is registered)."""
    return lambda: "".join(_ended(source()) for source in worker.metrics_sources())


def _ended(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


def _local_worker_of(worker: WorkerRole | None) -> Callable[[str], ModelWorker | None]:
    """endpoint path → the ModelWorker of this process serving it now, if any."""

    def local_worker(path: str) -> ModelWorker | None:
        manager = worker.manager if worker is not None else None
        return manager.local_worker(path) if manager is not None else None

    return local_worker


def _confirm_listed(
    options: ServerOptions, worker: WorkerRole, frontend: FrontendRole | TritonDoorRole | None
) -> Callable[[str], Awaitable[None]] | None:
    """What a new generation waits for before the one it replaces is withdrawn
    (models/manager.py): Dynamo's frontend in this process is asked whether it lists the model.
    The triton door in this process is told in-process before that (ModelManager.listeners):
    nothing to wait for while it is the only door, as with `mem` discovery. Doors in other
    processes cannot be asked: they get DYN_BRIDGE_REMOTE_FRONTEND_GRACE_SECS."""
    if isinstance(frontend, FrontendRole):
        return frontend.confirm_listed
    if isinstance(frontend, TritonDoorRole) and options.discovery_backend == "mem":
        return None
    return worker.grace_for_other_doors


# Descriptors besides the listeners' connections: models' files, the runtime's sockets, pipes.
OTHER_FILES = 1024


def _fit_open_files(options: ServerOptions) -> ServerOptions:
    """Room for every listener's connection cap (tuning.py): the triton door's gRPC cap, unless
    given, is what the open-file limit leaves after the HTTP listeners' caps, the clients'
    shared memory regions and the rest (gRPC core cannot close an idle connection to make
    room, so a smaller cap would let idle connections lock new clients out); a warning when
    the hard limit leaves too little."""
    files = open_files_to_hard_limit()
    listeners = 1 + int(options.control_port is not None) + int(options.http is not None)
    needed = listeners * options.http_limits.max_connections + OTHER_FILES
    door = options.door
    if door is not None and options.role != "worker":
        if options.allow_client_shm:
            # A client's region on an object of its own keeps a descriptor (shm.py).
            needed += options.max_shm_regions
        if door.max_connections is None:
            room = max(files - needed, LEAST_CONNECTIONS)
            door = dataclasses.replace(door, max_connections=room)
            options = dataclasses.replace(options, door=door)
            log.debug("gRPC: at most %d connections (what RLIMIT_NOFILE leaves)", room)
        needed += door.max_connections or 0
    if files < needed:
        log.warning(
            "at most %d open files (RLIMIT_NOFILE), fewer than the connection caps may use "
            "(%d with the rest): lower --http-max-connections / --grpc-max-connections or "
            "raise the limit (ulimit -n)",
            files,
            needed,
        )
    return options


def _local_changes_of(worker: WorkerRole | None) -> Callable[[Callable[[str], None]], None]:
    """Subscribe a listener to this process's model changes (a name), if it has a worker."""

    def subscribe(listener: Callable[[str], None]) -> None:
        manager = worker.manager if worker is not None else None
        if manager is not None:
            manager.listeners.append(listener)

    return subscribe


async def _listen(
    options: ServerOptions,
    index: ClusterIndex,
    worker: WorkerRole | None,
    frontend: FrontendRole | TritonDoorRole | None,
    stop: asyncio.Event,
    watch: DiscoveryWatch,
) -> tuple[ControlPort | None, MetricsServer | None]:
    """Bind the control and metrics ports (before any model is registered)."""
    control: ControlPort | None = None
    if options.control_port is not None:  # any role: it reaches the workers through Dynamo
        control = ControlPort(
            index,
            options.control_port,
            options.http_restricted_api,
            options.http_limits,
            ready=lambda: watch.usable() and not stop.is_set(),
            max_input_size=options.http_max_input_size,
            strict_readiness=options.strict_readiness,
        )
        try:
            await control.start()
        except HttpConfigError as exc:
            raise StartupError(f"--control-port: {exc}") from None

    metrics_server: MetricsServer | None = None
    if options.allow_metrics:
        ready = worker.ready if worker is not None else frontend.ready  # type: ignore[union-attr]
        sources = [_worker_metrics(worker)] if worker is not None else []
        if worker is not None and options.allow_gpu_metrics and options.gpus:
            sources.append(GpuMetrics(options.gpus).render)  # the GPUs this worker's models use
        metrics_server = MetricsServer(
            options.metrics_address,
            options.metrics_port,
            sources,
            frontend.http_port if frontend is not None else None,
            ready=lambda: ready() and not stop.is_set(),
            limits=options.http_limits,
            discovery_usable=watch.usable,
        )
        try:
            await metrics_server.start()
        except HttpConfigError as exc:
            raise PortUnavailable(f"--metrics-port {options.metrics_port}: {exc}") from None
    return control, metrics_server


async def serve(options: ServerOptions) -> None:
    """Run this process's role(s) until SIGINT/SIGTERM (or the frontend stops)."""
    loop = asyncio.get_running_loop()
    keep_large_buffers()  # big tensors reuse the heap, not fresh pages (tuning.py)
    options = _fit_open_files(options)
    if options.door is not None and options.role != "worker":
        batch_scheduling()  # the door's threads stop preempting the GIL holder (tuning.py)
    # A worker with DYN_SYSTEM_PORT serves Dynamo's system status server; a frontend must not
    # (spec dynamo_runtime.md §5): it reads the variable when the runtime starts.
    if options.role == "frontend":
        os.environ.pop("DYN_SYSTEM_PORT", None)
    await check_services(options.discovery_backend, options.request_plane, options.role)
    check_free(listeners(options))  # before anything slow: one line naming the flag
    worker = WorkerRole(options) if options.role != "frontend" else None
    frontend: FrontendRole | TritonDoorRole | None = None
    if options.role != "worker":
        if options.door is None:
            frontend = FrontendRole(options)
        else:
            # The door calls this process's own workers directly (frontends/triton/routes.py).
            frontend = TritonDoorRole(
                options,
                local_worker=_local_worker_of(worker),
                local_changes=_local_changes_of(worker),
            )
    if worker is not None:
        await worker.load()  # before the runtime: the status table comes first, as in Triton

    runtime = start_runtime(options.discovery_backend, options.request_plane, options.role)
    # What this process stamps on the requests it sends to other workers (transport/arrival.py):
    # how long the TCP request plane waits for them to take one.
    tcp = options.request_plane == "tcp"
    set_caller_timeout(request_plane_timeout(os.environ) if tcp else None)
    # Start-up is all or nothing: every port is bound (the door's: free a moment ago) before
    # any model is registered, so a failed start leaves no registration behind.
    stop = asyncio.Event()
    # etcd unreachable: not ready; the runtime shut down under us (lease lost): stop, status 1.
    watch = DiscoveryWatch.for_backend(
        options.discovery_backend,
        options.request_plane,
        on_lost=stop.set,
        exit_on_loss=options.exit_on_lease_loss,
    )
    # The process's one client of the control endpoint (bridge/cluster/index.py), shared by
    # every role that reads it (the control port, the triton door, BLS across workers): one
    # cache, one refresh. Started before any of them serves, stopped after all of them.
    index = ClusterIndex(runtime, options.namespace)
    await index.start()
    try:
        control, metrics_server = await _listen(options, index, worker, frontend, stop, watch)
        check_free(door_listeners(options))
    except (StartupError, RuntimeSettingsError) as exc:
        # Nothing is registered yet; the runtime and the loaded models' threads would hold a
        # plain return up.
        log.error("%s", exc)
        _exit_now(1)
    watch.start(runtime, options.namespace)
    for role in (worker, frontend):
        if role is not None:
            role.discovery_usable = watch.usable
    if worker is not None:
        await worker.start(runtime, index, _confirm_listed(options, worker, frontend))

    heap.freeze()  # everything loaded so far lives as long as the server (heap.py)
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    stopped = asyncio.ensure_future(stop.wait())
    waiting: set[asyncio.Future] = {stopped}
    if isinstance(frontend, TritonDoorRole):
        waiting.add(frontend.start(index))
    elif frontend is not None:
        waiting.add(frontend.start(runtime))
    else:
        log.info("serving the models of this worker through discovery (no gRPC port)")
    await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    failed = False
    if frontend is not None and frontend.task is not None and frontend.task.done():
        # Dynamo's frontend ends with a runtime shut down: was it that (a lost lease)?
        await watch.settle(timeout=LEASE_SETTLE_S)
        if frontend.task.exception() is not None and not watch.lost:
            failed = True  # e.g. its port taken since the check: withdraw, then exit 1
            log.error("the front door stopped: %s", frontend.task.exception())
    watch.stopping()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, _second_signal)
    dynamo_noise.shutting_down = True  # the discovery watchers end with the runtime: noise
    if frontend is not None:
        frontend.stopping()
    if control is not None:
        await control.stop(grace=min(options.exit_timeout, 1.0))
    clean = True
    if worker is not None:
        log.info(
            "shutting down: draining in-flight requests (at most %.0f s, --exit-timeout-secs)",
            options.exit_timeout,
        )
        # Armed to the end: whatever is left of the exit is bounded too.
        _arm_exit_watchdog(options.exit_timeout + RUNTIME_STOP_S)
        clean = await worker.close(runtime, options.exit_timeout, withdraw=not watch.lost)
    else:
        log.info("shutting down")
        _arm_exit_watchdog(options.exit_timeout + RUNTIME_STOP_S)
        if frontend is not None:  # the triton door's calls in flight finish first
            await frontend.drained(options.exit_timeout)
    if metrics_server is not None:
        await metrics_server.stop()
    index.stop()  # every reader has stopped: the control port, the door, the models' BLS calls
    if worker is not None:
        await asyncio.sleep(LAST_RESPONSES_S)
    runtime.shutdown()
    if worker is not None:
        await worker.wait_served(timeout=SERVE_CALLS_RETURN_S)
    stopped.cancel()
    if not clean and not watch.lost:
        # Threads stuck in model code would be joined at exit (or hold the executor's join).
        log.error(EXIT_TIMEOUT_TEXT)
    if watch.lost and not options.exit_on_lease_loss:
        # Nothing of this process serves any more (its ports are closed: not ready). Once etcd
        # answers, the process starts again from its own command line (roles/discovery.py),
        # after a wait that grows with the losses in a row (a revoking loop costs little).
        await back_off_before_reexec(os.environ)
        await watch.until_etcd_answers()
        log.warning("etcd answers again: starting this process again (same pid and arguments)")
        _reexec()
    if failed or not clean or watch.lost:  # a lost lease: said at once (roles/discovery.py)
        _exit_now(1)
