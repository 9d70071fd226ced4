"""Composition root: load the repository, start the runtime, the workers and the frontend.

Start-up follows Triton: every model is loaded first and a status table is printed; a model that
fails to load is reported and skipped unless `--exit-on-error`. Shutdown (SIGINT/SIGTERM) stops
advertising every model, lets in-flight requests finish, runs every instance's `finalize()`, and
only then stops the runtime.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from dynamo.runtime import DistributedRuntime

from model_repository_loader.config import ConfigOptions
from model_repository_loader.loader import LoadedRepository, load_repository

from .frontend import run_grpc_frontend
from .status_table import format_status_table
from .worker import ModelWorker

log = logging.getLogger("dynamo_bridge")


@dataclass(frozen=True, slots=True)
class ServerOptions:
    model_repositories: list[Path]
    grpc_port: int = 8001
    metrics_port: int = 8002
    host: str = "127.0.0.1"
    namespace: str = "dynamo_bridge"
    exit_on_error: bool = False
    loader: ConfigOptions = field(default_factory=ConfigOptions)


class StartupError(Exception):
    """The server must not start (a model failed to load with --exit-on-error)."""


def _pin_request_plane_to_loopback() -> None:
    # One process: the worker and the frontend talk over Dynamo's TCP request plane. Without
    # these it binds the host's primary address; nothing outside this process needs it.
    os.environ.setdefault("DYN_TCP_RPC_HOST", "127.0.0.1")
    os.environ.setdefault("DYN_TCP_RESPONSE_STREAM_HOST", "127.0.0.1")


async def serve(options: ServerOptions) -> None:
    """Run the embedded default: one process, `mem` discovery, `tcp` request plane."""
    loop = asyncio.get_running_loop()
    repository: LoadedRepository = await loop.run_in_executor(
        None, load_repository, options.model_repositories, options.loader
    )
    print(format_status_table(repository.statuses.values()), flush=True)
    if options.exit_on_error and repository.failures:
        repository.close()
        raise StartupError("failed to load all models")

    _pin_request_plane_to_loopback()
    runtime = DistributedRuntime(loop, "mem", "tcp")
    workers = [
        ModelWorker(runtime, options.namespace, model) for model in repository.models.values()
    ]
    for worker in workers:
        await worker.start()

    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    frontend = asyncio.ensure_future(
        run_grpc_frontend(runtime, options.grpc_port, options.metrics_port, options.host)
    )
    log.info("serving KServe gRPC on %s:%d", options.host, options.grpc_port)
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({frontend, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if frontend.done() and frontend.exception() is not None:
        log.error("gRPC frontend stopped: %s", frontend.exception())

    await _shutdown(runtime, workers, repository)
    stopped.cancel()


async def _shutdown(
    runtime: DistributedRuntime, workers: list[ModelWorker], repository: LoadedRepository
) -> None:
    log.info("shutting down: draining in-flight requests")
    for worker in workers:
        try:
            await worker.stop()
        except Exception as exc:  # keep shutting the rest down
            log.warning("unregistering '%s' failed: %s", worker.name, exc)
    # Drain and finalize on a thread: finalize() is model code and may block.
    await asyncio.get_running_loop().run_in_executor(None, repository.close)
    await asyncio.sleep(0.2)  # let the last responses leave through the frontend
    runtime.shutdown()
