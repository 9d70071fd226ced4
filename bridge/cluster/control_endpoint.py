"""The bridge control endpoint: `<namespace>.bridge.control`, served by every process that
serves models (docs/worker_protocol.md §1).

Whatever crosses processes goes through Dynamo endpoints, never a protocol of our own: a caller
lists the bridge processes with `client.instance_ids()` on this endpoint and asks each one with
`client.direct({"op": ...}, instance_id)`. Requests and answers are plain dicts (msgpack on the
request plane). Model components never use the component name `bridge` (worker.py
`component_name` always ends with `-<hash>`), so the two never meet in discovery.

Ops:
- `{"op": "index"}` → `{"worker": "<host>:<pid>", "host": str, "models": [...]}`, read from
  the manager's live state at the time of the call (`host`: bridge/transport/shm_regions.py
  `host_id`): one entry per model name this process knows, ready or not,
  with the endpoint of the generation serving it now (empty when none) and its serialized
  Triton `ModelConfig` (empty when none is loaded).
- `{"op": "stats"}` → `{"worker": ..., "models": [{"name", "version", "last_inference",
  "inference_count", "execution_count", "inference_stats": {<kind>: [count, ns], ...},
  "batch_stats": [{"batch_size", <kind>: [count, ns], ...}]}, ...]}`: every served version's
  statistics (model_repository_loader/scheduling/stats.py), durations in ns as Triton keeps
  them. A front door sums them over the workers serving a model (Triton's ModelStatistics).
- `{"op": "folders"}` → `{"worker": ..., "names": [...]}`: every model name of the repositories
  (a scan of the folders, on a thread) and every model loaded from files, as Triton's
  repository index lists them, loaded or not; an error (INTERNAL) when a repository cannot be
  read.
- `{"op": "load", "name": str, "config": str, "files": {"file:<path>": bytes}}` and
  `{"op": "unload", "name": str}` → `{}` once done, or an error with Triton's code and text
  (the worker's `--model-control-mode` rules: load/unload only in explicit mode).
- `{"op": "log_settings", "settings": {<Triton LogSettings name>: value}}` → the process's
  settings after the change (`{"settings": {...}}`), or an error with Triton's code and text
  (bridge/logs.py `check_log_settings`); `"settings": {}` only reads them. The triton door
  sends a client's LogSettings change to every worker this way.
- anything else → `{"error": {"code": "INVALID_ARG", "message": ...}}`.

More ops (`ready`) can join `ControlEndpoint.ops`, in the same style.
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

from ..logs import apply_log_settings, check_log_settings
from ..transport.shm_regions import host_id

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

CONTROL_COMPONENT = "bridge"
CONTROL_ENDPOINT = "control"
# Answers carry this in every index entry: the model endpoints here take the bridge form.
BRIDGE_FORM_VERSION = 1

Op = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


def control_path(namespace: str) -> str:
    """The control endpoint's path in `namespace`."""
    return f"{namespace}.{CONTROL_COMPONENT}.{CONTROL_ENDPOINT}"


def worker_id() -> str:
    """This process as the index names it: `<host>:<pid>`."""
    return f"{socket.gethostname()}:{os.getpid()}"


def index_entries(manager: ServedModels) -> list[dict[str, Any]]:
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
            {
                "name": name,
                "versions": [str(v) for v in versions],
                "ready": ready,
                "reason": status.reason if status is not None else "",
                "endpoint": worker.path if worker is not None and model is not None else "",
                "config": model.config.SerializeToString() if model is not None else b"",
                "bridge_form": BRIDGE_FORM_VERSION,
            }
        )
    return entries


class ControlEndpoint:
    """Serves the control endpoint for one process's models (a ServedModels)."""

    def __init__(self, runtime: DistributedRuntime, namespace: str, manager: ServedModels) -> None:
        self.path = control_path(namespace)
        self._endpoint = runtime.endpoint(self.path)
        self._manager = manager
        self.worker = worker_id()
        self.ops: dict[str, Op] = {
            "index": self._index,
            "stats": self._stats,
            "folders": self._folders,
            "load": self._load,
            "unload": self._unload,
            "log_settings": self._log_settings,
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
            yield _error(ErrorCode.INVALID_ARG, f"unknown control op {op_name!r} (known: {known})")
            return
        try:
            answer = await op(request)
        except Exception as exc:  # an op that fails answers INTERNAL, the endpoint stays up
            log.exception("control op %r failed", op_name)
            answer = _error(ErrorCode.INTERNAL, f"control op {op_name!r} failed: {exc}")
        yield answer

    async def _index(self, request: dict[str, Any]) -> dict[str, Any]:
        # `host`: a door with the same id sends tensors through shared memory (bridge/transport/)
        return {"worker": self.worker, "host": host_id(), "models": index_entries(self._manager)}

    async def _stats(self, request: dict[str, Any]) -> dict[str, Any]:
        return {"worker": self.worker, "models": stats_entries(self._manager)}

    async def _folders(self, request: dict[str, Any]) -> dict[str, Any]:
        manager = self._manager
        sources = await asyncio.to_thread(repository.scan, manager.repositories)
        names = {source.name for source in sources} | set(manager.repository.models)
        return {"worker": self.worker, "names": sorted(names)}

    async def _log_settings(self, request: dict[str, Any]) -> dict[str, Any]:
        changes = request.get("settings") or {}
        if not isinstance(changes, dict):
            return _error(ErrorCode.INVALID_ARG, "malformed log_settings request")
        valid, error = check_log_settings(changes)
        settings = apply_log_settings(valid)
        return _error(*error) if error is not None else {"settings": settings}

    async def _load(self, request: dict[str, Any]) -> dict[str, Any]:
        return await self._change(request, unload=False)

    async def _unload(self, request: dict[str, Any]) -> dict[str, Any]:
        return await self._change(request, unload=True)

    async def _change(self, request: dict[str, Any], unload: bool) -> dict[str, Any]:
        name = request.get("name")
        if not isinstance(name, str) or not name:
            return _error(ErrorCode.INVALID_ARG, "a model name is required")
        try:
            self._manager.refuse_unless_explicit()
            if unload:
                await self._manager.unload(name)
            else:
                files = request.get("files") or {}
                config = request.get("config") or ""
                if not isinstance(files, dict) or not isinstance(config, str):
                    return _error(ErrorCode.INVALID_ARG, "malformed load request")
                await self._manager.load(name, config, files or None)
        except TritonStatusError as exc:
            return _error(exc.code, str(exc))
        return {}


def _duration(duration: Any) -> list[int]:
    return [duration.count, duration.ns]


def stats_entries(manager: ServedModels) -> list[dict[str, Any]]:
    """One entry per served model version that keeps statistics (ensembles included)."""
    entries = []
    for name, model in sorted(manager.repository.models.items()):
        for version, served in sorted(getattr(model, "versions", {}).items()):
            stats = getattr(served, "stats", None)
            if not isinstance(stats, ModelStats):
                continue
            snap = stats.snapshot()
            entries.append(
                {
                    "name": name,
                    "version": str(version),
                    "last_inference": snap.last_inference_ms,
                    "inference_count": snap.inference_count,
                    "execution_count": snap.execution_count,
                    "inference_stats": {
                        kind: _duration(getattr(snap, kind)) for kind in INFER_KINDS
                    },
                    "batch_stats": [
                        {
                            "batch_size": batch.batch_size,
                            **{kind: _duration(getattr(batch, kind)) for kind in BATCH_KINDS},
                        }
                        for batch in snap.batch_stats
                    ],
                }
            )
    return entries


# The durations of a stats row (Triton's InferStatistics and InferBatchStatistics fields): what
# this side sends and the door reads (frontends/triton/service.py).
INFER_KINDS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)
BATCH_KINDS = ("compute_input", "compute_infer", "compute_output")


def _error(code: ErrorCode, message: str) -> dict[str, Any]:
    # On the wire a code travels by name (docs/worker_protocol.md).
    return {"error": {"code": code.name, "message": message}}
