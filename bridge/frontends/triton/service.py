"""Triton's inference protocol, apart from its wire: what every RPC / route answers.

The gRPC door (grpc/) and the HTTP door (http/) differ only in how a request arrives and how an
answer leaves. What they answer is decided here, once: health and readiness, metadata and
config per version, statistics, the repository, and where an inference request goes. Answers
are tritonclient's protobuf messages (the HTTP door renders them as Triton's JSON); every
refusal is a `DoorError` with Triton's code and text.

Models are found in the directory (directory.py) and reached in the bridge tensor form
(docs/worker_protocol.md §2) over a route per endpoint (routes.py): Dynamo's request plane, or
a direct call when this process's own worker serves the endpoint (the embedded default). The
checks the door can make from the request and the index are made here; the rest (input names,
shapes, batch sizes, versions, model errors) come back from the worker as error items.

What was checked against Triton 2.51 [V]: ModelReady on an unknown model or version is `false`,
not an error; ModelMetadata's `platform` is the config's, or its backend when the config has
none (`python`); inference on a decoupled model through a unary call is UNSUPPORTED.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from dynamo.runtime import Context
from tritonclient.grpc import service_pb2 as pb

from model_repository_loader.pb_utils.errors import ErrorCode
from model_repository_loader.validation import (
    RequestError,
    config_datatype_name,
    no_available_versions_error,
    parse_model_version,
    unknown_model_error,
    version_not_ready_error,
)

from ...cluster.index import EndpointWithdrawn
from ...cluster.protocol import BATCH_KINDS, INFER_KINDS, StatsRow, load_request, unload_request
from ...serialized_bytes import BytesLimits
from ...tracing.config import TraceConfig
from ...tracing.request import WireTrace
from ...transport.shm_regions import Identity
from .directory import Directory, ModelEntry
from .door_error import DoorError
from .log_trace_settings import LogSettings, TraceSettings
from .model_cards import FOREIGN_VERSION
from .routes import LocalRoute
from .shm import DEFAULT_MAX_REGIONS, SharedMemory, made_by_nobody

SERVER_NAME = "triton"
SERVER_VERSION = "2.51.0"  # the Triton release whose behaviour the door follows
# Triton's extensions that the door really serves.
EXTENSIONS = (
    "classification",
    "model_repository",
    "system_shared_memory",
    "statistics",
    "sequence",
    "model_configuration",
    "binary_tensor_data",
    "parameters",
)
DECOUPLED_UNARY = "ModelInfer RPC doesn't support models with decoupled transaction policy"
# Triton's answers while it shuts down [V]: health "Server exiting"; ModelReady, the repository
# and statistics "Server not ready"; a model's metadata, config and inference "has no available
# versions" (its models are being unloaded).
SERVER_EXITING = "Server exiting"
SERVER_NOT_READY = "Server not ready"
# Dynamo 1.6's request-plane errors that say a request was never sent to any worker (the
# endpoint has no instance, or the one picked was removed first): only these are retried, since
# a model that may have run the request must not run it twice.
NEVER_SENT = (
    "No workers available for endpoint",
    "Worker removed before request could be sent",
)

log = logging.getLogger(__name__)


def version_number(text: str) -> int:
    """A request's version text as a number (-1: none given), or Triton's error."""
    try:
        return parse_model_version(text)
    except RequestError as exc:
        raise DoorError(exc.code, exc.message) from None


def _never_sent(exc: Exception) -> bool:
    """The request went to no worker (so no model can have run it)."""
    if isinstance(exc, EndpointWithdrawn):
        return True
    text = str(exc)
    return any(marker in text for marker in NEVER_SENT)


def _require_model(entry: ModelEntry | None, name: str) -> ModelEntry:
    if entry is None:
        raise DoorError(ErrorCode.NOT_FOUND, unknown_model_error(name))
    return entry


def _require_version(entry: ModelEntry, text: str) -> str:
    """The ready version a metadata/config request names ("" = the newest), or Triton's error."""
    version = version_number(text)
    if not entry.versions:
        raise DoorError(*entry.unavailable())
    if version == -1:
        return max(entry.versions, key=int)
    if str(version) not in entry.versions:
        raise DoorError(ErrorCode.NOT_FOUND, unknown_model_error(entry.name, version))
    return str(version)


def _tensor_metadata(tensors: Any, batching: bool) -> list[pb.ModelMetadataResponse.TensorMetadata]:
    batch = [-1] if batching else []
    return [
        pb.ModelMetadataResponse.TensorMetadata(
            name=t.name, datatype=config_datatype_name(t.data_type), shape=batch + list(t.dims)
        )
        for t in tensors
    ]


class InFlight:
    """Counts the inference calls in flight, on the loop and on the gRPC wire's threads;
    `wait_idle` (on the loop) returns once there are none."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()
        self._idle: asyncio.Future[None] | None = None  # what wait_idle awaits

    def __enter__(self) -> None:
        with self._lock:
            self.count += 1

    def __exit__(self, *exc_info: object) -> None:
        with self._lock:
            self.count -= 1
            idle = self._idle if self.count == 0 else None
            if idle is not None:
                self._idle = None
        if idle is not None:
            idle.get_loop().call_soon_threadsafe(_settle, idle)

    async def wait_idle(self, timeout: float) -> bool:
        """True once no call is in flight; False if some still are after `timeout` s."""
        with self._lock:
            if self.count == 0:
                return True
            if self._idle is None:
                self._idle = asyncio.get_running_loop().create_future()
            idle = self._idle
        try:
            await asyncio.wait_for(asyncio.shield(idle), timeout)
        except TimeoutError:
            return False
        return True


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


@dataclass(frozen=True, slots=True)
class Target:
    """Where one inference request goes: the model's entry, the version it asks for ("" = the
    model's default) and the endpoint that serves it now."""

    entry: ModelEntry
    version: str
    endpoint: str

    @property
    def decoupled(self) -> bool:
        return self.entry.decoupled


def without_loans(body: dict) -> dict:
    """`body` as it may cross a process: lent shared memory (shm.py) as bytes, and no output
    sinks (the door writes those outputs itself)."""
    tensors = body.get("tensors") or ()
    outputs = body.get("outputs") or ()
    if not any(isinstance(t["data"]["values"], memoryview) for t in tensors) and not any(
        "sink" in o for o in outputs
    ):
        return body
    out = dict(body)
    out["tensors"] = [
        {**t, "data": {**t["data"], "values": bytes(t["data"]["values"])}}
        if isinstance(t["data"]["values"], memoryview)
        else t
        for t in tensors
    ]
    if outputs:
        out["outputs"] = [{k: v for k, v in o.items() if k != "sink"} for o in outputs]
    return out


class TritonService:
    """Triton's answers over the models of one Dynamo namespace."""

    def __init__(
        self,
        directory: Directory,
        ready: Callable[[], bool] = lambda: True,
        bytes_limits: BytesLimits | None = None,
        trace: TraceConfig | None = None,
        bridge_made: Callable[[Identity], bool] = made_by_nobody,
        strict_readiness: bool = True,
        allow_client_shm: bool = True,
        max_shm_regions: int = DEFAULT_MAX_REGIONS,
    ) -> None:
        self.directory = directory
        # tritonserver's --strict-readiness: server readiness includes every model's.
        self.strict_readiness = strict_readiness
        # What one request's BYTES inputs may cost once decoded: the wires check it first.
        self.bytes_limits = bytes_limits or BytesLimits()
        self._ready = ready  # the composition root's own readiness (starting, stopping)
        # Clients' system shared memory; never one of the door's own regions (`bridge_made`:
        # the door's ShmDoor.made, shm.py).
        self.shm = SharedMemory(
            bridge_made=bridge_made, allowed=allow_client_shm, max_regions=max_shm_regions
        )
        self.logging = LogSettings(directory)
        self.trace = TraceSettings(directory, trace)
        self.exiting = False  # shutdown began: answer as Triton does while it exits
        self.calls = InFlight()  # inference calls in flight, which the shutdown waits for

    def begin_exit(self) -> None:
        """Shutdown began: from now on answer as an exiting Triton (in-flight calls go on)."""
        self.exiting = True

    def _refuse_while_exiting(self, name: str | None = None) -> None:
        if not self.exiting:
            return
        if name is None:
            raise DoorError(ErrorCode.UNAVAILABLE, SERVER_NOT_READY)
        known = name in self.directory.known_names()
        text = no_available_versions_error(name) if known else unknown_model_error(name)
        raise DoorError(ErrorCode.NOT_FOUND, text)

    # -- health and metadata ----------------------------------------------------------------

    def server_live(self) -> bool:
        if self.exiting:
            raise DoorError(ErrorCode.UNAVAILABLE, SERVER_EXITING)
        return True

    async def server_ready(self) -> bool:
        """Strict readiness, as Triton's default: every model it knows is loaded and passes its
        runtime check (its instances alive, its own `is_ready()`); else the server's own."""
        if self.exiting:
            raise DoorError(ErrorCode.UNAVAILABLE, SERVER_EXITING)
        if not self._ready():
            return False
        if not self.strict_readiness:
            return True
        models = await self.directory.fresh()
        if not (self.directory.complete and all(e.ready for e in models.values())):
            return False
        return await self.directory.runtime_ready()

    async def model_ready(self, name: str, version_text: str) -> bool:
        """Loaded, and its runtime check passes on a worker that serves it (asked each time, as
        Triton asks: a dead instance process or the model's `is_ready()` makes it not ready)."""
        self._refuse_while_exiting()
        version = version_number(version_text)
        entry = (await self.directory.fresh()).get(name)
        if entry is None:
            return False
        if entry.bridge_form:
            return await self.directory.runtime_ready(name, version, entry.owners)
        # A foreign worker's model: as its model card says.
        return bool(entry.versions) and (version == -1 or str(version) in entry.versions)

    def server_metadata(self) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(
            name=SERVER_NAME, version=SERVER_VERSION, extensions=EXTENSIONS
        )

    async def model_metadata(self, name: str, version_text: str) -> pb.ModelMetadataResponse:
        self._refuse_while_exiting(name)
        entry = _require_model((await self.directory.fresh()).get(name), name)
        version = _require_version(entry, version_text)
        config = entry.config
        batching = config.max_batch_size > 0
        versions = [version] if version_text else sorted(entry.versions, key=int)
        return pb.ModelMetadataResponse(
            name=name,
            versions=versions,
            platform=config.platform or config.backend,
            inputs=_tensor_metadata(config.input, batching),
            outputs=_tensor_metadata(config.output, batching),
        )

    async def model_config(self, name: str, version_text: str) -> pb.ModelConfigResponse:
        self._refuse_while_exiting(name)
        entry = _require_model((await self.directory.fresh()).get(name), name)
        _require_version(entry, version_text)
        return pb.ModelConfigResponse(config=entry.config)

    # -- statistics -------------------------------------------------------------------------

    async def statistics(self, name: str, version_text: str) -> pb.ModelStatisticsResponse:
        """Triton's fields, summed over the workers serving each version. No name: every
        model (the version is then ignored, as Triton does [V])."""
        self._refuse_while_exiting()
        version = version_number(version_text) if name else -1
        rows = await self.directory.stats()
        if name:
            rows = [row for row in rows if row.name == name]
            if not rows:
                raise DoorError(ErrorCode.INVALID_ARG, f"requested model '{name}' is not available")
            if version != -1:
                rows = [row for row in rows if row.version == str(version)]
                if not rows:
                    raise DoorError(
                        ErrorCode.INVALID_ARG,
                        f"requested model version is not available for model '{name}'",
                    )
        return statistics_response(rows)

    # -- repository -------------------------------------------------------------------------

    async def repository_index(self, ready_only: bool) -> pb.RepositoryIndexResponse:
        """Every model the workers know, one row per version, by name: READY, or UNAVAILABLE
        with the reason it failed (`ready_only`: the READY rows only). As Triton 2.51 [V]: a
        model whose config did not load, and a model folder never loaded (explicit mode), is
        a row with its name only, and one whose version policy selects nothing is not listed."""
        self._refuse_while_exiting()
        response = pb.RepositoryIndexResponse()
        models = await self.directory.fresh()
        folders = set() if ready_only else await self.directory.folders()
        for name in sorted(set(models) | folders):
            entry = models.get(name)
            if entry is None:
                response.models.add(name=name)
                continue
            state = "READY" if entry.versions else "UNAVAILABLE"
            if ready_only and state != "READY":
                continue
            versions = sorted(entry.versions or entry.known_versions, key=int)
            if not versions:
                if not entry.selects_no_version:
                    response.models.add(name=name)
                continue
            for version in versions:
                response.models.add(name=name, version=version, state=state, reason=entry.reason)
        return response

    async def load(
        self, name: str, config: str = "", files: dict[str, bytes] | None = None
    ) -> None:
        """Forwarded to the worker(s) that know the model, which apply their control mode's
        rules (explicit only) and answer with Triton's texts. `files` are keyed `file:<path>`."""
        self._refuse_while_exiting()
        error = await self.directory.change(name, load_request(name, config, files))
        if error is not None:
            raise DoorError.from_item(error)

    async def unload(self, name: str) -> None:
        self._refuse_while_exiting()
        error = await self.directory.change(name, unload_request(name))
        if error is not None:
            raise DoorError.from_item(error)

    # -- inference --------------------------------------------------------------------------

    def lends(self, target: Target) -> bool:
        """May the wire lend `target` the client's shared memory (shm.py), mapped, instead of
        copying it? Only to this process's own worker (the embedded default)."""
        return self.shm.any_registered() and self.directory.serves_locally(target.endpoint)

    async def target(self, name: str, version_text: str, stream: bool) -> Target:
        """Where a request for `name` goes, or Triton's error for a model that cannot take it
        (unknown, no ready version, decoupled through a unary call)."""
        self._refuse_while_exiting(name)
        version = version_number(version_text)  # Triton reads the version before the model
        return self._target(await self.directory.lookup(name), name, version, stream)

    def target_now(self, name: str, version_text: str, stream: bool) -> Target | None:
        """`target()` when the cached index can answer it, asking nothing (any thread: the
        door's gRPC threads); None when `target()` must ask the workers."""
        self._refuse_while_exiting(name)
        version = version_number(version_text)
        found = self.directory.cached(name)
        return None if found is None else self._target(found, name, version, stream)

    def _target(self, found: ModelEntry | None, name: str, version: int, stream: bool) -> Target:
        if found is None or not found.endpoints or not found.versions:
            newest = self.directory.departed(name)
            if newest is not None:  # a rolling restart: a code Triton clients retry on
                shown = newest if version == -1 else version
                raise DoorError(ErrorCode.UNAVAILABLE, version_not_ready_error(name, shown))
        entry = _require_model(found, name)
        if not entry.endpoints or not entry.versions:
            raise DoorError(*entry.unavailable(version))
        if not entry.bridge_form and version not in (-1, int(FOREIGN_VERSION)):
            # a worker of Dynamo's standard form only: its one version (model_cards.py)
            raise DoorError(ErrorCode.NOT_FOUND, unknown_model_error(name, version))
        if not stream and entry.decoupled:
            raise DoorError(ErrorCode.UNSUPPORTED, DECOUPLED_UNARY)
        return Target(entry, "" if version == -1 else str(version), entry.endpoints[-1])

    async def items(self, target: Target, body: dict, context: Context) -> AsyncIterator[dict]:
        """The worker's bridge-form response items for one request, up to and including the
        final one. The caller stops `context` when its client goes away.

        A request that provably reached no worker because its endpoint was withdrawn since the
        last index (another process reloaded or unloaded the model) is sent once more, to the
        endpoint a fresh index names (directory.py); any other failure is the answer."""
        for retry in (False, True):
            answered = False
            try:
                route = await self.directory.route(target.endpoint, target.entry)
                sent = body if isinstance(route, LocalRoute) else without_loans(body)
                async for item in route.generate(sent, context):
                    answered = True
                    yield item
                return
            except DoorError:
                raise
            except Exception as exc:  # the request plane failed (worker gone, not reachable)
                if answered or retry or not _never_sent(exc):
                    raise DoorError(ErrorCode.UNAVAILABLE, str(exc)) from None
                log.info(
                    "'%s': endpoint %s withdrawn; asking the workers again (%s)",
                    target.entry.name,
                    target.endpoint,
                    exc,
                )
                self.directory.forget(target.endpoint)
                target = await self._moved(target)

    async def answers(
        self, target: Target, body: dict, context: Context, trace: WireTrace | None = None
    ) -> list[dict]:
        """A unary request's answers (gRPC ModelInfer, HTTP infer), its flag-only FINAL left
        out: one, unless the model misbehaved (`single_answer`). The worker's part of `trace`
        is kept. The caller stops `context` (or cancels) when its client goes away.

        To this process's own worker the request goes without a stream (LocalRoute.answer):
        no response queue, no generator per layer, one wake-up of the loop."""
        route = self.directory.local_route(target.endpoint)
        if route is not None:
            try:
                items = await route.answer(body, context)
            except Exception as exc:  # as items() words a failure of the worker
                raise DoorError(ErrorCode.UNAVAILABLE, str(exc)) from None
        else:
            items = [item async for item in self.items(target, body, context)]
        answers = []
        for item in items:
            if trace is not None:
                trace.took(item)
            if not item.get("empty"):  # a flag-only FINAL: a unary call has nothing to show
                answers.append(item)
        if trace is not None:
            trace.stamp("INFER_RESPONSE_COMPLETE")
        return answers

    async def _moved(self, target: Target) -> Target:
        """`target` as a fresh index has it now, or Triton's answer when the model has gone."""
        name = target.entry.name
        entry = _require_model((await self.directory.fresh()).get(name), name)
        if not entry.endpoints or not entry.versions:
            raise DoorError(*entry.unavailable())
        return Target(entry, target.version, entry.endpoints[-1])

    def close(self) -> None:
        self.shm.close()
        self.trace.close()


def single_answer(answers: list[dict]) -> dict:
    """The one answer of a unary request, or INTERNAL when the model gave more or none."""
    if len(answers) != 1:
        raise DoorError(ErrorCode.INTERNAL, f"expected a single response, got {len(answers)}")
    return answers[0]


def _add(target: Any, pair: tuple[int, int] | None) -> None:
    target.SetInParent()  # Triton sends every duration, zero ones as empty messages [V]
    if pair:
        target.count += pair[0]
        target.ns += pair[1]


def statistics_response(rows: list[StatsRow]) -> pb.ModelStatisticsResponse:
    """The workers' `stats` rows → ModelStatisticsResponse, one entry per (model, version)."""
    response = pb.ModelStatisticsResponse()
    merged: dict[tuple[str, str], pb.ModelStatistics] = {}
    batches: dict[tuple[str, str, int], pb.InferBatchStatistics] = {}
    for row in sorted(rows, key=lambda r: (r.name, int(r.version))):
        key = (row.name, row.version)
        stats = merged.get(key)
        if stats is None:
            stats = merged[key] = response.model_stats.add(name=key[0], version=key[1])
        stats.last_inference = max(stats.last_inference, row.last_inference)
        stats.inference_count += row.inference_count
        stats.execution_count += row.execution_count
        for kind in INFER_KINDS:
            _add(getattr(stats.inference_stats, kind), row.inference.get(kind))
        for batch in row.batches:
            size = batch.batch_size
            entry = batches.get((*key, size))
            if entry is None:
                entry = batches[(*key, size)] = stats.batch_stats.add(batch_size=size)
            for kind in BATCH_KINDS:
                _add(getattr(entry, kind), batch.durations.get(kind))
    return response
