"""Composition root: load the repository, start the runtime, the workers and the frontend.

Start-up follows Triton: the models of the start-up set (all of them, or the `--load-model` ones
in explicit mode) are loaded first and a status table is printed; a model that fails to load is
reported and skipped unless `--exit-on-error`. Then, by `--model-control-mode`: `poll` watches the
repositories and swaps changed models with no gap (reload.py, manager.py), `explicit` takes
load/unload from `--control-port` and `pb_utils.load_model`, `none` serves what loaded.
The metrics port (`--metrics-port`, bridge/metrics/) serves Triton's `nv_inference_*` metrics,
the models' custom metrics and Dynamo's frontend metrics; the frontend's own HTTP server runs on a
private loopback port behind it.
Shutdown (SIGINT/SIGTERM) stops advertising every model, lets in-flight requests finish, runs
every instance's `finalize()`, and only then stops the runtime, all within
`--exit-timeout-secs` as tritonserver does: past it (an `execute`, `finalize` or reload's
`initialize` that never returns) the process flushes its logs and exits with status 1 without
waiting for those threads. A second SIGINT/SIGTERM exits at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

from dynamo.runtime import DistributedRuntime

from model_repository_loader import pb_utils, repository
from model_repository_loader.config import ConfigOptions
from model_repository_loader.loader import LoadedRepository, ModelStatus, load_repository
from model_repository_loader.pb_utils import metrics as custom_metrics

from . import heap
from .control import MODEL_REPOSITORY, ControlServer, Restriction
from .frontend import run_grpc_frontend
from .frontends.triton import DoorOptions, TritonDoor
from .frontends.triton.server import DoorConfigError, credentials
from .manager import ManagerOptions, ModelControl, ModelManager, digests_of
from .metrics.server import MetricsServer, free_loopback_port
from .metrics.triton import MetricsConfig, TritonMetrics
from .reload import RepositoryWatcher
from .status_table import format_status_table

log = logging.getLogger("dynamo_bridge")


@dataclass(frozen=True, slots=True)
class ServerOptions:
    model_repositories: list[Path]
    grpc_port: int = 8001
    metrics_port: int = 8002
    allow_metrics: bool = True
    metrics_address: str = "127.0.0.1"
    metrics_config: MetricsConfig = field(default_factory=MetricsConfig)
    host: str = "127.0.0.1"
    namespace: str = "dynamo_bridge"
    exit_on_error: bool = False
    loader: ConfigOptions = field(default_factory=ConfigOptions)
    model_control_mode: str = "poll"
    load_models: tuple[str, ...] = ()  # explicit mode's start-up set; "*" = all
    control_port: int | None = None
    reload_debounce: float = 0.5
    # `--http-restricted-api`: {api group: header the requests must carry}
    http_restricted_api: dict[str, Restriction] = field(default_factory=dict)
    exit_timeout: float = 30.0  # tritonserver's --exit-timeout-secs
    door: DoorOptions | None = None  # `--frontend triton`: its TLS options; None = dynamo


class StartupError(Exception):
    """The server must not start (a model failed to load with --exit-on-error)."""


def _pin_request_plane_to_loopback() -> None:
    # One process: the worker and the frontend talk over Dynamo's TCP request plane. Without
    # these it binds the host's primary address; nothing outside this process needs it.
    os.environ.setdefault("DYN_TCP_RPC_HOST", "127.0.0.1")
    os.environ.setdefault("DYN_TCP_RESPONSE_STREAM_HOST", "127.0.0.1")


def _exit_now(status: int) -> None:
    """Leave the process at once (threads stuck in model code are not joined); logs first."""
    try:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status)


def _second_signal() -> None:
    log.warning("second signal: exiting now, without waiting for models to finish")
    _exit_now(1)


def _arm_exit_watchdog(seconds: float) -> threading.Timer:
    """The last resort if shutdown itself stalls past its bound (the event loop included)."""
    timer = threading.Timer(seconds, lambda: (log.error(EXIT_TIMEOUT_TEXT), _exit_now(1)))
    timer.daemon = True
    timer.start()
    return timer


EXIT_TIMEOUT_TEXT = "exit timeout expired: exiting without waiting for the models still running"
# Past --exit-timeout-secs: what stopping the runtime and the frontend may still take.
RUNTIME_STOP_S = 5.0


def _startup_set(options: ServerOptions) -> set[str] | None:
    """The models to load at start-up; None = all."""
    if options.model_control_mode != "explicit":
        if options.load_models:
            log.warning("--load-model is only used with --model-control-mode=explicit")
        return None
    if "*" in options.load_models:
        return None
    return set(options.load_models)


def _initial_load(
    options: ServerOptions, only: set[str] | None
) -> tuple[dict[str, str], LoadedRepository]:
    # Digests first: a file saved while the models load then differs from its digest, and the
    # refresh after start-up picks it up.
    digests = digests_of(options.model_repositories)
    loaded = load_repository(options.model_repositories, options.loader, only)
    for name in sorted((only or set()) - set(loaded.statuses)):
        reason = f"failed to load '{name}', failed to poll from model repository"
        log.error("%s", reason)
        loaded.statuses[name] = ModelStatus(name, [], False, reason)
    return digests, loaded


async def serve(options: ServerOptions) -> None:
    """Run the embedded default: one process, `mem` discovery, `tcp` request plane."""
    loop = asyncio.get_running_loop()
    mode = options.model_control_mode
    if options.door is not None:
        try:
            credentials(options.door)  # unreadable TLS files: fail before loading any model
        except DoorConfigError as exc:
            raise StartupError(str(exc)) from None
    if mode == "poll":
        # A .pyc written now and an edit of the same size within the same second would make the
        # next import run the old code; without caches every reload compiles what is on disk.
        sys.dont_write_bytecode = True
    control = ModelControl(mode)
    pb_utils.set_model_control(control)  # "Server not ready" until start-up is over, as Triton
    digests, loaded = await loop.run_in_executor(
        None, _initial_load, options, _startup_set(options)
    )
    serving = not (options.exit_on_error and loaded.failures)
    print(format_status_table(loaded.statuses.values(), serving), flush=True)
    if not serving:
        loaded.close()
        pb_utils.set_model_control(None)
        raise StartupError("failed to load all models")

    _pin_request_plane_to_loopback()
    runtime = DistributedRuntime(loop, "mem", "tcp")
    # Dynamo's frontend serves its own HTTP port; it moves to a private loopback port and the
    # bridge serves --metrics-port itself, adding its frontend's metrics (bridge/metrics/).
    frontend_port = free_loopback_port() if options.door is None else None
    manager = ModelManager(
        runtime,
        ManagerOptions(
            repositories=list(options.model_repositories),
            loader=options.loader,
            namespace=options.namespace,
            mode=mode,
            frontend_metrics_port=frontend_port,
        ),
        loaded,
    )
    control.manager = manager
    await manager.start(digests)

    watcher: RepositoryWatcher | None = None
    if mode == "poll":
        watcher = RepositoryWatcher(
            options.model_repositories, manager.refresh, debounce=options.reload_debounce
        )
        try:
            watcher.start()
        except OSError as exc:  # e.g. the inotify instance limit: serve on, without reloads
            log.error("cannot watch the model repositories, hot reload is off: %s", exc)
            watcher = None
        else:
            # Anything changed while the models were loading (digests were read before).
            names = set(digests) | {s.name for s in repository.scan(options.model_repositories)}
            asyncio.ensure_future(manager.refresh(names, retry_failed=False))
    control_server: ControlServer | None = None
    if options.control_port is not None:
        control_server = ControlServer(
            manager,
            options.control_port,
            explicit=mode == "explicit",
            restriction=options.http_restricted_api.get(MODEL_REPOSITORY),
        )
        await control_server.start()
    elif mode == "explicit":
        log.warning(
            "explicit model control without --control-port: models load at run time only "
            "through pb_utils.load_model"
        )

    stop = asyncio.Event()

    def strictly_ready() -> bool:
        # Triton's strict readiness (its default): not while starting or stopping, and not while
        # a model it tried to load is not ready, whether it failed or was unloaded [V on 2.51].
        return (
            manager.ready
            and not stop.is_set()
            and all(status.ready for status in manager.repository.statuses.values())
        )

    metrics_server: MetricsServer | None = None
    if options.allow_metrics:
        triton_metrics = TritonMetrics(lambda: manager.repository.models, options.metrics_config)
        metrics_server = MetricsServer(
            options.metrics_address,
            options.metrics_port,
            [triton_metrics.render, custom_metrics.render_prometheus],
            frontend_port,
            ready=strictly_ready,
        )
        await metrics_server.start()

    heap.freeze()  # everything loaded so far lives as long as the server (heap.py)
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    door: TritonDoor | None = None
    if options.door is not None:
        door_options = replace(
            options.door, port=options.grpc_port, address=options.host, namespace=options.namespace
        )
        door = TritonDoor(runtime, door_options, ready=strictly_ready)
        try:
            await door.start()
        except (DoorConfigError, RuntimeError) as exc:
            log.error("cannot serve gRPC: %s", exc)
            stop.set()
        frontend = asyncio.ensure_future(door.wait())
    else:
        frontend = asyncio.ensure_future(
            run_grpc_frontend(runtime, options.grpc_port, frontend_port, options.host)
        )
    # Dynamo 1.6's KServe frontend listens on every interface whatever `http_host` says (seen
    # with `ss -ltnp`), its own HTTP port too. Print the real address, and say it loudly.
    if door is None and options.host not in ("0.0.0.0", "::"):
        log.warning(
            "--host %s is not honoured: Dynamo's KServe frontend binds gRPC (port %d) and its "
            "own HTTP port (%d, which the metrics port passes through to) on every interface "
            "(0.0.0.0), so both are reachable from other hosts; restrict them with a firewall "
            "or a network namespace",
            options.host,
            options.grpc_port,
            frontend_port,
        )
    if door is None:
        log.info("serving KServe gRPC on 0.0.0.0:%d (all interfaces)", options.grpc_port)
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({frontend, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if frontend.done() and frontend.exception() is not None:
        log.error("gRPC frontend stopped: %s", frontend.exception())

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, _second_signal)
    log.info(
        "shutting down: draining in-flight requests (at most %.0f s, --exit-timeout-secs)",
        options.exit_timeout,
    )
    deadline = loop.time() + options.exit_timeout
    # Armed to the end: whatever is left of the exit is bounded too.
    _arm_exit_watchdog(options.exit_timeout + RUNTIME_STOP_S)
    if watcher is not None:
        await watcher.stop()
    if control_server is not None:
        await control_server.stop()
    clean = await manager.close(timeout=max(0.0, deadline - loop.time()))
    if metrics_server is not None:
        await metrics_server.stop()
    pb_utils.set_model_control(None)
    await asyncio.sleep(0.2)  # let the last responses leave through the frontend
    if door is not None:
        await door.stop()
    runtime.shutdown()
    await manager.wait_served(timeout=2.0)
    stopped.cancel()
    if not clean:
        # Threads stuck in model code would be joined at exit (or hold the executor's join).
        log.error(EXIT_TIMEOUT_TEXT)
        _exit_now(1)
