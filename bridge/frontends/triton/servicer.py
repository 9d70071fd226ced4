"""The RPCs of Triton's `GRPCInferenceService`, answered from Dynamo's runtime.

Models are found in the directory (directory.py) and reached over Dynamo's request plane with
the bridge tensor form (tensors.py). Every error is Triton's code and text (status.py): the
ones the door can tell from the request and the index are answered here, the rest (input names,
shapes, batch sizes, versions, model errors) come back from the worker as error items.

What was checked against Triton 2.51 [V]: ModelReady on an unknown model or version is `false`,
not an error; ModelMetadata's `platform` is the config's, or its backend when the config has
none (`python`); ModelInfer on a decoupled model is UNIMPLEMENTED; a unary answer carries no
`triton_final_response`, every streamed one does; an error on a stream travels in
`error_message` and the stream goes on; requests on one stream run concurrently.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from dynamo.runtime import Context
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from model_repository_loader.pb_utils.errors import ErrorCode
from model_repository_loader.validation import (
    RequestError,
    config_datatype_name,
    parse_model_version,
    unknown_model_error,
)

from .directory import Directory, ModelEntry
from .shm import SharedMemory
from .status import DoorError
from .tensors import to_bridge_request, to_infer_response, wants_empty_final

log = logging.getLogger(__name__)

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
UNPARSABLE = "Unable to parse request"


class Malformed:
    """What a request that is not a valid protobuf deserializes to (server.py)."""


MALFORMED = Malformed()


def _version(text: str) -> int:
    try:
        return parse_model_version(text)
    except RequestError as exc:
        raise DoorError(exc.code, exc.message) from None


def _require_model(entry: ModelEntry | None, name: str) -> ModelEntry:
    if entry is None:
        raise DoorError(ErrorCode.NOT_FOUND, unknown_model_error(name))
    return entry


def _require_version(entry: ModelEntry, text: str) -> str:
    """The ready version a metadata/config request names ("" = the newest), or Triton's error."""
    version = _version(text)
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


class TritonServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Triton's gRPC service over the models of one Dynamo namespace."""

    def __init__(self, directory: Directory, ready: Callable[[], bool] = lambda: True) -> None:
        self._directory = directory
        self._ready = ready  # the composition root's own readiness (starting, stopping)
        self.shm = SharedMemory()

    # -- health and metadata --------------------------------------------------------------------

    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        # Strict readiness, as Triton's default: every model it knows is ready.
        if not self._ready():
            return pb.ServerReadyResponse(ready=False)
        models = await self._directory.fresh()
        ready = self._directory.complete and all(e.ready for e in models.values())
        return pb.ServerReadyResponse(ready=ready)

    async def ModelReady(self, request: Any, context: Any) -> pb.ModelReadyResponse:
        return await _answer(context, self._model_ready, request)

    async def _model_ready(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        version = _version(request.version)
        entry = (await self._directory.fresh()).get(request.name)
        if entry is None or not entry.versions:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=version == -1 or str(version) in entry.versions)

    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(
            name=SERVER_NAME, version=SERVER_VERSION, extensions=EXTENSIONS
        )

    async def ModelMetadata(self, request: Any, context: Any) -> pb.ModelMetadataResponse:
        return await _answer(context, self._model_metadata, request)

    async def _model_metadata(self, request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        entry = _require_model((await self._directory.fresh()).get(request.name), request.name)
        version = _require_version(entry, request.version)
        config = entry.config
        batching = config.max_batch_size > 0
        versions = [version] if request.version else sorted(entry.versions, key=int)
        return pb.ModelMetadataResponse(
            name=request.name,
            versions=versions,
            platform=config.platform or config.backend,
            inputs=_tensor_metadata(config.input, batching),
            outputs=_tensor_metadata(config.output, batching),
        )

    async def ModelConfig(self, request: Any, context: Any) -> pb.ModelConfigResponse:
        return await _answer(context, self._model_config, request)

    async def _model_config(self, request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        entry = _require_model((await self._directory.fresh()).get(request.name), request.name)
        _require_version(entry, request.version)
        return pb.ModelConfigResponse(config=entry.config)

    # -- statistics ---------------------------------------------------------------------------

    async def ModelStatistics(self, request: Any, context: Any) -> pb.ModelStatisticsResponse:
        return await _answer(context, self._model_statistics, request)

    async def _model_statistics(
        self, request: pb.ModelStatisticsRequest
    ) -> pb.ModelStatisticsResponse:
        """Triton's fields, summed over the workers serving each version. No name: every
        model (the version is then ignored, as Triton does [V])."""
        version = _version(request.version) if request.name else -1
        rows = await self._directory.stats()
        if request.name:
            rows = [row for row in rows if row.get("name") == request.name]
            if not rows:
                raise DoorError(
                    ErrorCode.INVALID_ARG, f"requested model '{request.name}' is not available"
                )
            if version != -1:
                rows = [row for row in rows if row.get("version") == str(version)]
                if not rows:
                    raise DoorError(
                        ErrorCode.INVALID_ARG,
                        f"requested model version is not available for model '{request.name}'",
                    )
        return statistics_response(rows)

    # -- shared memory ------------------------------------------------------------------------

    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        def register(r: pb.SystemSharedMemoryRegisterRequest) -> Any:
            self.shm.register(r.name, r.key, r.offset, r.byte_size)
            return pb.SystemSharedMemoryRegisterResponse()

        return await _answer(context, _sync(register), request)

    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        def status(r: pb.SystemSharedMemoryStatusRequest) -> Any:
            response = pb.SystemSharedMemoryStatusResponse()
            for region in self.shm.status(r.name):
                response.regions[region.name].name = region.name
                response.regions[region.name].key = region.key
                response.regions[region.name].offset = region.offset
                response.regions[region.name].byte_size = region.byte_size
            return response

        return await _answer(context, _sync(status), request)

    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        def unregister(r: pb.SystemSharedMemoryUnregisterRequest) -> Any:
            self.shm.unregister(r.name)
            return pb.SystemSharedMemoryUnregisterResponse()

        return await _answer(context, _sync(unregister), request)

    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        def register(r: pb.CudaSharedMemoryRegisterRequest) -> Any:
            raise DoorError(
                ErrorCode.UNSUPPORTED,
                f"failed to register CUDA shared memory region: '{r.name}', GPUs not supported",
            )

        return await _answer(context, _sync(register), request)

    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        def status(r: pb.CudaSharedMemoryStatusRequest) -> Any:
            if r.name:  # nothing is ever registered
                raise DoorError(
                    ErrorCode.NOT_FOUND, f"Unable to find cuda shared memory region: '{r.name}'"
                )
            return pb.CudaSharedMemoryStatusResponse()

        return await _answer(context, _sync(status), request)

    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        return await _answer(
            context, _sync(lambda r: pb.CudaSharedMemoryUnregisterResponse()), request
        )

    # -- not served ---------------------------------------------------------------------------

    async def LogSettings(self, request: Any, context: Any) -> Any:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "LogSettings is not supported by dynamo-bridge: set logging with --log-verbose, "
            "--log-format and --log-file at start-up",
        )

    async def TraceSetting(self, request: Any, context: Any) -> Any:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "TraceSetting is not supported by dynamo-bridge: it records no Triton traces",
        )

    # -- repository ---------------------------------------------------------------------------

    async def RepositoryIndex(self, request: Any, context: Any) -> pb.RepositoryIndexResponse:
        return await _answer(context, self._repository_index, request)

    async def _repository_index(
        self, request: pb.RepositoryIndexRequest
    ) -> pb.RepositoryIndexResponse:
        """Every model the workers know, one row per version, by name: READY, or UNAVAILABLE
        with the reason it failed (`ready=true`: the READY rows only). As Triton 2.51 [V]: a
        model whose config did not load is a row with its name only, and one whose version
        policy selects nothing is not listed."""
        response = pb.RepositoryIndexResponse()
        models = await self._directory.fresh()
        for name in sorted(models):
            entry = models[name]
            state = "READY" if entry.versions else "UNAVAILABLE"
            if request.ready and state != "READY":
                continue
            versions = sorted(entry.versions or entry.known_versions, key=int)
            if not versions:
                if not entry.selects_no_version:
                    response.models.add(name=name)
                continue
            for version in versions:
                response.models.add(name=name, version=version, state=state, reason=entry.reason)
        return response

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        return await _answer(context, self._load, request)

    async def _load(self, request: pb.RepositoryModelLoadRequest) -> Any:
        """Forwarded to the worker(s) that know the model, which apply their control mode's
        rules (explicit only) and answer with Triton's texts."""
        files = {}
        config = ""
        for key, parameter in request.parameters.items():
            if key == "config":
                config = parameter.string_param
            elif key.startswith("file:"):
                files[key] = parameter.bytes_param
        change = {"op": "load", "name": request.model_name, "config": config, "files": files}
        error = await self._directory.change(request.model_name, change)
        if error is not None:
            raise DoorError.from_item(error)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        return await _answer(context, self._unload, request)

    async def _unload(self, request: pb.RepositoryModelUnloadRequest) -> Any:
        change = {"op": "unload", "name": request.model_name}
        error = await self._directory.change(request.model_name, change)
        if error is not None:
            raise DoorError.from_item(error)
        return pb.RepositoryModelUnloadResponse()

    # -- inference ------------------------------------------------------------------------------

    async def _prepare(self, request: pb.ModelInferRequest, stream: bool) -> tuple[Any, dict, bool]:
        """The client of the endpoint to call, the bridge-form request and whether the model is
        decoupled; or DoorError."""
        name = request.model_name
        entry = _require_model(await self._directory.lookup(name), name)
        version = _version(request.model_version)
        if not entry.endpoints or not entry.versions:
            raise DoorError(*entry.unavailable())
        if not stream and entry.decoupled:
            raise DoorError(ErrorCode.UNSUPPORTED, DECOUPLED_UNARY)
        version_text = "" if version == -1 else str(version)
        body = to_bridge_request(request, version_text, entry.config, self.shm)
        client = await self._directory.client(entry.endpoints[-1])
        return client, body, entry.decoupled

    async def _items(self, client: Any, body: dict, context: Context) -> AsyncIterator[dict]:
        """The worker's response items for one request, up to and including the final one."""
        try:
            stream = await client.round_robin(body, annotated=False, context=context)
            async for item in stream:
                yield item
                if item.get("final", False):
                    return
        except DoorError:
            raise
        except Exception as exc:  # the request plane failed (worker gone, not reachable)
            raise DoorError(ErrorCode.UNAVAILABLE, str(exc)) from None

    async def ModelInfer(self, request: Any, context: Any) -> pb.ModelInferResponse:
        return await _answer(context, self._model_infer, request)

    async def _model_infer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        client, body, _ = await self._prepare(request, stream=False)
        answers: list[dict] = []
        dynamo_context = Context()
        try:
            async for item in self._items(client, body, dynamo_context):
                if item.get("empty"):
                    continue  # a flag-only FINAL: a unary call has nothing to show for it
                answers.append(item)
        except asyncio.CancelledError:
            dynamo_context.stop_generating()
            raise
        if len(answers) != 1:
            raise DoorError(ErrorCode.INTERNAL, f"expected a single response, got {len(answers)}")
        answer = answers[0]
        if "error" in answer:
            raise DoorError.from_item(answer["error"])
        return to_infer_response(request, answer, shm=self.shm)

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Each request of the stream runs on its own as it arrives; their responses share the
        stream in the order they are produced (each request's own in order)."""
        out: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        running: set[asyncio.Task] = set()

        async def read() -> None:
            try:
                async for request in request_iterator:
                    task = asyncio.ensure_future(self._stream_one(request, out))
                    running.add(task)
                    task.add_done_callback(running.discard)
                if running:
                    await asyncio.wait(set(running))
            finally:
                out.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while (response := await out.get()) is not None:
                yield response
            await reader  # a failed read of the client's stream ends the call with its error
        finally:
            for task in (reader, *running):
                task.cancel()

    async def _stream_one(self, request: Any, out: asyncio.Queue) -> None:
        dynamo_context = Context()
        try:
            if request is MALFORMED:
                raise DoorError(ErrorCode.INTERNAL, UNPARSABLE)
            client, body, decoupled = await self._prepare(request, stream=True)
            # Triton sends the empty final response only for decoupled models [V].
            empty_final = decoupled and wants_empty_final(request)
            answered = False
            async for item in self._items(client, body, dynamo_context):
                final = bool(item.get("final", False))
                if answered and not decoupled:
                    continue  # Triton streams one answer of a default-mode model, no more [V]
                answered = answered or not item.get("empty")
                if "error" in item:
                    message = DoorError.from_item(item["error"]).message
                    out.put_nowait(pb.ModelStreamInferResponse(error_message=message))
                elif item.get("empty"):
                    if empty_final:
                        out.put_nowait(
                            pb.ModelStreamInferResponse(
                                infer_response=to_infer_response(request, item, final, self.shm)
                            )
                        )
                else:
                    response = to_infer_response(request, item, final, self.shm)
                    out.put_nowait(pb.ModelStreamInferResponse(infer_response=response))
        except DoorError as exc:
            out.put_nowait(pb.ModelStreamInferResponse(error_message=exc.message))
        except asyncio.CancelledError:
            dynamo_context.stop_generating()
            raise
        except Exception as exc:  # never let one request end the stream of the others
            log.exception("stream request failed")
            out.put_nowait(pb.ModelStreamInferResponse(error_message=f"internal error: {exc}"))


_INFER_KINDS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)
_BATCH_KINDS = ("compute_input", "compute_infer", "compute_output")


def _add(target: Any, pair: Any) -> None:
    target.SetInParent()  # Triton sends every duration, zero ones as empty messages [V]
    if pair:
        target.count += int(pair[0])
        target.ns += int(pair[1])


def statistics_response(rows: list[dict[str, Any]]) -> pb.ModelStatisticsResponse:
    """The workers' `stats` rows → ModelStatisticsResponse, one entry per (model, version)."""
    response = pb.ModelStatisticsResponse()
    merged: dict[tuple[str, str], pb.ModelStatistics] = {}
    batches: dict[tuple[str, str, int], pb.InferBatchStatistics] = {}
    for row in sorted(rows, key=lambda r: (r["name"], int(r["version"]))):
        key = (row["name"], row["version"])
        stats = merged.get(key)
        if stats is None:
            stats = merged[key] = response.model_stats.add(name=key[0], version=key[1])
        stats.last_inference = max(stats.last_inference, int(row.get("last_inference", 0)))
        stats.inference_count += int(row.get("inference_count", 0))
        stats.execution_count += int(row.get("execution_count", 0))
        inference = row.get("inference_stats", {})
        for kind in _INFER_KINDS:
            _add(getattr(stats.inference_stats, kind), inference.get(kind))
        for batch in row.get("batch_stats", ()):
            size = int(batch["batch_size"])
            entry = batches.get((*key, size))
            if entry is None:
                entry = batches[(*key, size)] = stats.batch_stats.add(batch_size=size)
            for kind in _BATCH_KINDS:
                _add(getattr(entry, kind), batch.get(kind))
    return response


def _sync(handler: Callable[[Any], Any]) -> Callable[[Any], Any]:
    async def run(request: Any) -> Any:
        return handler(request)

    return run


async def _answer(context: Any, handler: Callable[[Any], Any], request: Any) -> Any:
    """Run a unary handler; a DoorError becomes its gRPC status and Triton's text."""
    if request is MALFORMED:
        await context.abort(grpc.StatusCode.INTERNAL, UNPARSABLE)
    try:
        return await handler(request)
    except DoorError as exc:
        await context.abort(exc.status, exc.message)
