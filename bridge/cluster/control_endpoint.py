"""The bridge control endpoint: `<namespace>.bridge.control`, served by every process that
serves models (docs/worker_protocol.md §1).

Whatever crosses processes goes through Dynamo endpoints, never a protocol of our own: a caller
lists the bridge processes with `client.instance_ids()` on this endpoint and asks each one with
`client.direct({"op": ...}, instance_id)`. Requests and answers are plain dicts (msgpack on the
request plane). Model components never use the component name `bridge` (worker.py
`component_name` always ends with `-<hash>`), so the two never meet in discovery.

The ops, their rows and the error item are protocol.py's (docs/worker_protocol.md §1): the
index (with the process's `host`, bridge/transport/shm_regions.py `host_id`: a door with the
same id sends tensors through shared memory) and the folders are read from the manager's live
state at the time of the call, the statistics are every served version's
(model_repository_loader/scheduling/stats.py), load and unload follow the worker's
`--model-control-mode` (explicit only), and log_settings applies bridge/logs.py
`check_log_settings`. An unknown op is answered INVALID_ARG; an op that fails, INTERNAL.

`ready` runs Triton's runtime readiness of loaded model versions (each instance alive, then its
model's own `is_ready()`, model_repository_loader/readiness.py) on a thread, and logs each one
not ready as Triton does (verbose).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from model_repository_loader import repository
from model_repository_loader.errors import TritonStatusError
from model_repository_loader.loader import LoadedRepository
from model_repository_loader.pb_utils.errors import ErrorCode
from model_repository_loader.scheduling.stats import ModelStats

from ..dynamo_endpoints import dynamo_endpoint
from ..logs import apply_log_settings, check_log_settings
from ..transport.shm_regions import host_id
from .protocol import (
    BATCH_KINDS,
    INFER_KINDS,
    BatchRow,
    Duration,
    IndexAnswer,
    IndexRow,
    Op,
    ReadyRow,
    StatsRow,
    control_path,
    error_answer,
)

if TYPE_CHECKING:
    from dynamo.runtime import DistributedRuntime


class ServedModels(Protocol):
    """What the control endpoint answers from: the process's model manager
    (bridge/models/manager.py `ModelManager`), seen through what this side reads and asks."""

    @property
    def repository(self) -> LoadedRepository: ...
    @property
    def workers(self) -> Mapping[str, Any]: ...  # name -> its serving endpoint (`.path`)
    @property
    def repositories(self) -> list[Path]: ...  # the repository folders it was given

    def refuse_unless_explicit(self) -> None:
        """A TritonStatusError unless load/unload requests are taken from outside."""

    async def load(
        self, name: str, config_json: str = "", files: dict[str, bytes] | None = None
    ) -> None: ...
    async def unload(self, name: str) -> None: ...


log = logging.getLogger(__name__)

OpHandler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


def worker_id() -> str:
    """This process as the index names it: `<host>:<pid>`."""
    return f"{socket.gethostname()}:{os.getpid()}"


def index_rows(manager: ServedModels) -> list[IndexRow]:
    """One entry per model name the manager knows (loaded, failed, or unloaded)."""
    repository = manager.repository
    models = repository.models
    statuses = repository.statuses
    entries = []
    for name in sorted(set(statuses) | set(models)):
        model = models.get(name)
        status = statuses.get(name)
        worker = manager.workers.get(name)
        if model is not None:
            versions = sorted(model.versions)
            ready = bool(getattr(model, "ready", True)) and (status is None or status.ready)
        else:
            versions = list(status.versions) if status is not None else []
            ready = False
        entries.append(
            IndexRow(
                name=name,
                versions=tuple(str(v) for v in versions),
                ready=ready,
                reason=status.reason if status is not None else "",
                endpoint=worker.path if worker is not None and model is not None else "",
                config=model.config.SerializeToString() if model is not None else b"",
            )
        )
    return entries


class ControlEndpoint:
    """Serves the control endpoint for one process's models (a ServedModels)."""

    def __init__(self, runtime: DistributedRuntime, namespace: str, manager: ServedModels) -> None:
        self.path = control_path(namespace)
        self._endpoint = dynamo_endpoint(runtime, self.path)
        self._manager = manager
        self.worker = worker_id()
        self.ops: dict[str, OpHandler] = {
            Op.INDEX: self._index,
            Op.STATS: self._stats,
            Op.FOLDERS: self._folders,
            Op.LOAD: self._load,
            Op.UNLOAD: self._unload,
            Op.LOG_SETTINGS: self._log_settings,
            Op.READY: self._ready,
        }
        self.serving: asyncio.Future[Any] | None = None

    def start(self) -> asyncio.Future[Any]:
        """Serve the endpoint; the future ends when the runtime shuts down."""
        self.serving = asyncio.ensure_future(self._endpoint.serve_endpoint(self.handle))
        return self.serving

    async def handle(self, request: Any, context: Any = None) -> AsyncIterator[dict[str, Any]]:
        """One control request → one answer (errors are answers too, never exceptions)."""
        op_name = request.get("op") if isinstance(request, dict) else None
        op = self.ops.get(op_name) if isinstance(op_name, str) else None
        if op is None:
            known = ", ".join(sorted(self.ops))
            yield error_answer(
                ErrorCode.INVALID_ARG, f"unknown control op {op_name!r} (known: {known})"
            )
            return
        try:
            answer = await op(request)
        except Exception as exc:  # an op that fails answers INTERNAL, the endpoint stays up
            log.exception("control op %r failed", op_name)
            answer = error_answer(ErrorCode.INTERNAL, f"control op {op_name!r} failed: {exc}")
        yield answer

    async def _index(self, request: dict[str, Any]) -> dict[str, Any]:
        return IndexAnswer(self.worker, tuple(index_rows(self._manager)), host_id()).to_wire()

    async def _stats(self, request: dict[str, Any]) -> dict[str, Any]:
        return {"worker": self.worker, "models": [r.to_wire() for r in stats_rows(self._manager)]}

    async def _folders(self, request: dict[str, Any]) -> dict[str, Any]:
        manager = self._manager
        sources = await asyncio.to_thread(repository.scan, manager.repositories)
        names = {source.name for source in sources} | set(manager.repository.models)
        return {"worker": self.worker, "names": sorted(names)}

    async def _ready(self, request: dict[str, Any]) -> dict[str, Any]:
        name, version = request.get("name") or "", request.get("version", -1)
        if not isinstance(name, str) or not isinstance(version, int):
            return error_answer(ErrorCode.INVALID_ARG, "malformed ready request")
        # Each is_ready() may take up to its bound: never on the loop.
        rows = await asyncio.to_thread(ready_rows, self._manager, name, version)
        return {"worker": self.worker, "models": [row.to_wire() for row in rows]}

    async def _log_settings(self, request: dict[str, Any]) -> dict[str, Any]:
        changes = request.get("settings") or {}
        if not isinstance(changes, dict):
            return error_answer(ErrorCode.INVALID_ARG, "malformed log_settings request")
        valid, error = check_log_settings(changes)
        settings = apply_log_settings(valid)
        return error_answer(*error) if error is not None else {"settings": settings}

    async def _load(self, request: dict[str, Any]) -> dict[str, Any]:
        return await self._change(request, unload=False)

    async def _unload(self, request: dict[str, Any]) -> dict[str, Any]:
        return await self._change(request, unload=True)

    async def _change(self, request: dict[str, Any], unload: bool) -> dict[str, Any]:
        name = request.get("name")
        if not isinstance(name, str) or not name:
            return error_answer(ErrorCode.INVALID_ARG, "a model name is required")
        try:
            self._manager.refuse_unless_explicit()
            if unload:
                await self._manager.unload(name)
            else:
                files = request.get("files") or {}
                config = request.get("config") or ""
                if not isinstance(files, dict) or not isinstance(config, str):
                    return error_answer(ErrorCode.INVALID_ARG, "malformed load request")
                await self._manager.load(name, config, files or None)
        except TritonStatusError as exc:
            return error_answer(exc.code, str(exc))
        return {}


def _loaded_versions(manager: ServedModels, name: str, version: int) -> list[tuple[str, int, Any]]:
    """The versions in Triton's READY lifecycle state that a `ready` request asks about:
    `name`'s `version` (-1: its newest), or every one of every model for `name` ""."""
    repository = manager.repository
    chosen: list[tuple[str, int, Any]] = []
    for model_name, model in sorted(repository.models.items()):
        status = repository.statuses.get(model_name)
        if (name and model_name != name) or (status is not None and not status.ready):
            continue
        versions = model.versions
        if name:
            number = max(versions) if version == -1 else version
            versions = {number: versions[number]} if number in versions else {}
        chosen.extend((model_name, number, served) for number, served in sorted(versions.items()))
    return chosen


def ready_rows(manager: ServedModels, name: str, version: int) -> list[ReadyRow]:
    """Triton's runtime readiness (InferenceServer::ModelIsReady, and IsReady under strict
    readiness for `name` ""), with its verbose log line for a version that is not ready."""
    rows = []
    for model_name, number, served in _loaded_versions(manager, name, version):
        reason = served.check_ready() or ""
        rows.append(ReadyRow(model_name, number, reason))
        if not reason:
            continue
        if name:
            log.debug("Model '%s' version %d is not ready: %s", model_name, number, reason)
            continue
        log.debug(
            "Model '%s' version %d is in READY lifecycle state but failed runtime readiness "
            "check during server readiness evaluation: %s",
            model_name,
            number,
            reason,
        )
        break  # as Triton: the server is not ready; the other models need no asking
    return rows


def _duration(duration: Any) -> Duration:
    return (duration.count, duration.ns)


def stats_rows(manager: ServedModels) -> list[StatsRow]:
    """One row per served model version that keeps statistics (ensembles included)."""
    rows = []
    for name, model in sorted(manager.repository.models.items()):
        for version, served in sorted(getattr(model, "versions", {}).items()):
            stats = getattr(served, "stats", None)
            if not isinstance(stats, ModelStats):
                continue
            snap = stats.snapshot()
            rows.append(
                StatsRow(
                    name=name,
                    version=str(version),
                    last_inference=snap.last_inference_ms,
                    inference_count=snap.inference_count,
                    execution_count=snap.execution_count,
                    inference={kind: _duration(getattr(snap, kind)) for kind in INFER_KINDS},
                    batches=tuple(
                        BatchRow(
                            batch.batch_size,
                            {kind: _duration(getattr(batch, kind)) for kind in BATCH_KINDS},
                        )
                        for batch in snap.batch_stats
                    ),
                )
            )
    return rows
