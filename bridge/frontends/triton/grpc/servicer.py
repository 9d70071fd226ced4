"""The RPCs of Triton's `GRPCInferenceService`: protobufs in, the service's answers out.

What each RPC answers is decided by the protocol-neutral service (../service.py); this module
only unpacks requests, turns a `DoorError` into its gRPC status with Triton's text
(error_status.py), and runs ModelStreamInfer as Triton does [V]: requests on one stream run
concurrently, an error travels in `error_message` and the stream goes on, every streamed answer
carries `triton_final_response` (a unary one does not). A stream's answers wait for its client
in a bounded outbox, so a client that stops reading holds its models' `send()`
(bridge/models/endpoint.py) rather than the server's memory, and the handler gives the event
loop a turn whenever it is full; a client that cancels or goes away cancels the stream's
requests (their Dynamo context).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias

import grpc
from dynamo.runtime import Context
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from model_repository_loader.gpu.cuda import CudaUnavailable
from model_repository_loader.pb_utils.errors import ErrorCode

from ....codec import OFF_LOOP_BYTES, tensor_bytes
from ....offload import run_off_loop
from ....tracing.request import WireTrace
from ..door_error import DoorError
from ..header_forward import HeaderForwarding, forward_into
from ..service import TritonService, single_answer
from ..shm import SharedMemory
from ..tensor_checks import run_deferred, run_deferred_here
from .error_status import grpc_status, wire_text
from .tensors import (
    region_input_bytes,
    region_names,
    to_bridge_request,
    to_infer_response,
    wants_empty_final,
)
from .wire import MALFORMED, InferRequest, InferResponse, framed

log = logging.getLogger(__name__)

UNPARSABLE = "Unable to parse request"
# What ModelInfer answers, and what a ModelStreamInfer call sends (wire.py writes them).
# bytes: an answer serialized where it was made (tensors.answer_of).
Answer: TypeAlias = pb.ModelInferResponse | InferResponse | bytes
StreamAnswer: TypeAlias = pb.ModelStreamInferResponse | InferResponse


# `--grpc-stream-requests`: requests of one stream in flight at once (ModelStreamInfer).
# Triton reads a stream's requests without a bound. A client that reads its answers as they
# come (tritonclient does, on a thread of its own) never notices this one; a client that
# writes more than this many requests before reading any answer waits for itself, where
# Triton would hold every request it sends.
STREAM_REQUESTS = 1024


class TritonServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Triton's gRPC service over a `TritonService`."""

    def __init__(
        self,
        service: TritonService,
        forwarding: HeaderForwarding | None = None,
        stream_requests: int = STREAM_REQUESTS,
    ) -> None:
        """`forwarding`: `--grpc-header-forward-pattern` (header_forward.py), None if not set;
        `stream_requests`: `--grpc-stream-requests` (ModelStreamInfer)."""
        self.service = service
        self.forwarding = forwarding
        self.stream_requests = stream_requests

    # -- health and metadata ------------------------------------------------------------------

    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        async def live(r: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
            return pb.ServerLiveResponse(live=self.service.server_live())

        return await _answer(context, live, request)

    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        async def ready(r: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
            return pb.ServerReadyResponse(ready=await self.service.server_ready())

        return await _answer(context, ready, request)

    async def ModelReady(self, request: Any, context: Any) -> pb.ModelReadyResponse:
        async def ready(r: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
            return pb.ModelReadyResponse(ready=await self.service.model_ready(r.name, r.version))

        return await _answer(context, ready, request)

    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        return self.service.server_metadata()

    async def ModelMetadata(self, request: Any, context: Any) -> pb.ModelMetadataResponse:
        async def metadata(r: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
            return await self.service.model_metadata(r.name, r.version)

        return await _answer(context, metadata, request)

    async def ModelConfig(self, request: Any, context: Any) -> pb.ModelConfigResponse:
        async def config(r: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
            return await self.service.model_config(r.name, r.version)

        return await _answer(context, config, request)

    async def ModelStatistics(self, request: Any, context: Any) -> pb.ModelStatisticsResponse:
        async def statistics(r: pb.ModelStatisticsRequest) -> pb.ModelStatisticsResponse:
            return await self.service.statistics(r.name, r.version)

        return await _answer(context, statistics, request)

    # -- shared memory ------------------------------------------------------------------------

    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        async def register(r: pb.SystemSharedMemoryRegisterRequest) -> Any:
            self.service.shm.register(r.name, r.key, r.offset, r.byte_size)
            return pb.SystemSharedMemoryRegisterResponse()

        return await _answer(context, register, request)

    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        async def status(r: pb.SystemSharedMemoryStatusRequest) -> Any:
            response = pb.SystemSharedMemoryStatusResponse()
            for region in self.service.shm.status(r.name):
                response.regions[region.name].name = region.name
                response.regions[region.name].key = region.key
                response.regions[region.name].offset = region.offset
                response.regions[region.name].byte_size = region.byte_size
            return response

        return await _answer(context, status, request)

    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        async def unregister(r: pb.SystemSharedMemoryUnregisterRequest) -> Any:
            self.service.shm.unregister(r.name)
            return pb.SystemSharedMemoryUnregisterResponse()

        return await _answer(context, unregister, request)

    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        async def register(r: pb.CudaSharedMemoryRegisterRequest) -> Any:
            try:
                self.service.shm.register_cuda(r.name, r.raw_handle, r.device_id, r.byte_size)
            except CudaUnavailable:  # Triton's answer on a host without GPUs
                raise DoorError(
                    ErrorCode.UNSUPPORTED,
                    f"failed to register CUDA shared memory region: '{r.name}', GPUs not supported",
                ) from None
            return pb.CudaSharedMemoryRegisterResponse()

        return await _answer(context, register, request)

    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        async def status(r: pb.CudaSharedMemoryStatusRequest) -> Any:
            response = pb.CudaSharedMemoryStatusResponse()
            for region in self.service.shm.cuda_status(r.name):
                response.regions[region.name].name = region.name
                response.regions[region.name].device_id = region.device_id
                response.regions[region.name].byte_size = region.byte_size
            return response

        return await _answer(context, status, request)

    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        async def unregister(r: pb.CudaSharedMemoryUnregisterRequest) -> Any:
            self.service.shm.unregister_cuda(r.name)
            return pb.CudaSharedMemoryUnregisterResponse()

        return await _answer(context, unregister, request)

    # -- log and trace settings (../log_trace_settings.py) ------------------------------------

    async def LogSettings(self, request: Any, context: Any) -> pb.LogSettingsResponse:
        async def settings(r: pb.LogSettingsRequest) -> pb.LogSettingsResponse:
            changes = {key: _setting(value) for key, value in r.settings.items()}
            current = await self.service.logging.update(changes)
            response = pb.LogSettingsResponse()
            for key, value in current.items():
                # bool before int: a bool is an int in Python
                field = (
                    "bool_param"
                    if isinstance(value, bool)
                    else "uint32_param"
                    if isinstance(value, int)
                    else "string_param"
                )
                setattr(response.settings[key], field, value)
            return response

        return await _answer(context, settings, request)

    async def TraceSetting(self, request: Any, context: Any) -> pb.TraceSettingResponse:
        async def settings(r: pb.TraceSettingRequest) -> pb.TraceSettingResponse:
            changes: dict[str, list[str] | None] = {
                key: list(value.value) for key, value in r.settings.items()
            }
            current = await self.service.trace.update(r.model_name, changes)
            response = pb.TraceSettingResponse()
            for key, values in current.items():
                response.settings[key].value.extend(values)
            return response

        return await _answer(context, settings, request)

    # -- repository ---------------------------------------------------------------------------

    async def RepositoryIndex(self, request: Any, context: Any) -> pb.RepositoryIndexResponse:
        async def index(r: pb.RepositoryIndexRequest) -> pb.RepositoryIndexResponse:
            return await self.service.repository_index(r.ready)

        return await _answer(context, index, request)

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        async def load(r: pb.RepositoryModelLoadRequest) -> Any:
            config = ""
            files = {}
            for key, parameter in r.parameters.items():
                if key == "config":
                    config = parameter.string_param
                elif key.startswith("file:"):
                    files[key] = parameter.bytes_param
            await self.service.load(r.model_name, config, files)
            return pb.RepositoryModelLoadResponse()

        return await _answer(context, load, request)

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        async def unload(r: pb.RepositoryModelUnloadRequest) -> Any:
            await self.service.unload(r.model_name)
            return pb.RepositoryModelUnloadResponse()

        return await _answer(context, unload, request)

    # -- inference ------------------------------------------------------------------------------

    async def ModelInfer(self, request: Any, context: Any) -> Answer:
        with self.service.calls:  # a shutdown waits for it
            if not self.service.trace.active:  # tracing off: nothing more per request
                infer = functools.partial(self._model_infer_traced, context=context)
                return await _answer(context, infer, request)

            async def traced(r: InferRequest) -> Answer:
                return await self._model_infer(r, context)

            return await _answer(context, traced, request)

    async def _model_infer(self, request: InferRequest, context: Any) -> Answer:
        trace = self.service.trace.start(request.message.model_name, "GRPC", _traceparent(context))
        if trace is None:
            return await self._model_infer_traced(request, context, None)
        # The handler runs once the message is read: the wait and the read are not ours to
        # see, so both stamps are the handler's start.
        trace.stamp("GRPC_WAITREAD_START")
        trace.stamp("GRPC_WAITREAD_END")
        trace.request_id = request.message.id
        try:
            response = await self._model_infer_traced(request, context, trace)
            trace.stamp("GRPC_SEND_START")
            return response
        finally:
            trace.finish("GRPC_SEND_END")

    async def _model_infer_traced(
        self, received: InferRequest, context: Any, trace: WireTrace | None = None
    ) -> Answer:
        service = self.service
        request = received.message
        target = await service.target(request.model_name, request.model_version, stream=False)
        with service.shm.holding(region_names(request) if service.shm.regions else ()):
            return await self._model_infer_at(target, received, context, trace)

    async def _model_infer_at(
        self, target: Any, received: InferRequest, context: Any, trace: WireTrace | None
    ) -> Answer:
        service = self.service
        request = received.message
        body = await _converted(service, received, target)
        self.forward_headers(body, context)
        if trace is not None and target.entry.bridge_form:
            body["trace"] = trace.request_form()
        dynamo_context = Context()
        try:
            answer = single_answer(await service.answers(target, body, dynamo_context, trace))
        except asyncio.CancelledError:
            dynamo_context.stop_generating()
            raise
        if "error" in answer:
            raise DoorError.from_item(answer["error"])
        return await _placed_response(service.shm, request, answer, None, _batching(target))

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[list[StreamAnswer]]:
        """Each request of the stream runs on its own as it arrives; their responses share the
        stream in the order they are produced (each request's own in order). They are given in
        batches, every answer ready at the time (at least one), so that the thread that sends
        them (on_loop.py) crosses to the loop once per batch, not per answer.

        With the client's header `triton_grpc_error: true` (Triton 2.50+ [S]), the first error
        ends the whole stream instead: its gRPC status and text, and nothing more is read or
        answered (the stream's other requests are cancelled).

        At most `stream_requests` of its requests are in flight at once: the next one is asked
        for when one of them ends, and the stream's reader (on_loop.py) takes at most
        READ_AHEAD more from gRPC, whose flow control then holds the client's sends. A client
        that sends without reading its answers therefore holds that many requests here, not as
        many as it sends."""
        out = _Outbox(errors_end_stream=_wants_grpc_errors(context))
        running: set[asyncio.Task] = set()
        seats = asyncio.Semaphore(self.stream_requests)

        def ended(task: asyncio.Task) -> None:
            running.discard(task)
            seats.release()

        async def read() -> None:
            try:
                while True:
                    await seats.acquire()
                    try:
                        request = await anext(request_iterator)
                    except StopAsyncIteration:
                        break
                    task = asyncio.ensure_future(self._stream_one(request, out, context))
                    running.add(task)
                    task.add_done_callback(ended)
                if running:
                    await asyncio.wait(set(running))
            finally:
                out.end()

        reader = asyncio.ensure_future(read())
        try:
            while (batch := await out.take()) is not None:
                last = batch[-1]
                error = last if isinstance(last, DoorError) else None
                answers = [a for a in batch if not isinstance(a, DoorError)]
                if answers:
                    yield answers
                if error is not None:
                    for task in (reader, *running):
                        task.cancel()
                    await context.abort(grpc_status(error.code), wire_text(error.message))
            await reader  # a failed read of the client's stream ends the call with its error
        finally:
            for task in (reader, *running):
                task.cancel()

    async def _stream_one(self, request: Any, out: _Outbox, context: Any = None) -> None:
        with self.service.calls:  # a shutdown waits for it
            await self._stream_request(request, out, context)

    def forward_headers(self, body: dict, context: Any) -> None:
        """The call's metadata that `--grpc-header-forward-pattern` matches, as parameters."""
        forward_into(body, self.forwarded(context))

    def forwarded(self, context: Any) -> dict[str, dict[str, str]]:
        """The call's metadata that `--grpc-header-forward-pattern` matches, as bridge-form
        parameters (header_forward.py); none without the flag."""
        if self.forwarding is None or context is None:
            return {}
        metadata = context.invocation_metadata() or ()
        return self.forwarding.parameters((m.key, m.value) for m in metadata)

    async def _stream_request(self, received: Any, out: _Outbox, context: Any = None) -> None:
        service = self.service
        dynamo_context = Context()
        try:
            if received is MALFORMED:
                raise DoorError(ErrorCode.INTERNAL, UNPARSABLE)
            request = received.message
            target = await service.target(request.model_name, request.model_version, stream=True)
            with service.shm.holding(region_names(request) if service.shm.regions else ()):
                await self._stream_request_at(target, received, out, context, dynamo_context)
        except DoorError as exc:
            await out.fail(exc)
        except asyncio.CancelledError:
            dynamo_context.stop_generating()
            raise
        except Exception as exc:  # never let one request end the stream of the others
            log.exception("stream request failed")
            await out.fail(DoorError(ErrorCode.INTERNAL, f"internal error: {exc}"))

    async def _stream_request_at(
        self,
        target: Any,
        received: InferRequest,
        out: _Outbox,
        context: Any,
        dynamo_context: Context,
    ) -> None:
        service = self.service
        request = received.message
        body = await _converted(service, received, target)
        self.forward_headers(body, context)
        decoupled = target.decoupled
        # Triton sends the empty final response only for decoupled models [V].
        empty_final = decoupled and wants_empty_final(request)
        batching = _batching(target)
        answered = False
        async for item in service.items(target, body, dynamo_context):
            final = bool(item.get("final", False))
            if answered and not decoupled:
                continue  # Triton streams one answer of a default-mode model, no more [V]
            answered = answered or not item.get("empty")
            if "error" in item:
                await out.fail(DoorError.from_item(item["error"]))
            elif empty_final or not item.get("empty"):
                response = await _placed_response(service.shm, request, item, final, batching)
                if isinstance(response, pb.ModelInferResponse):
                    await out.put(pb.ModelStreamInferResponse(infer_response=response))
                else:  # written as the stream response's infer_response (wire.py)
                    await out.put(response)


def _wants_grpc_errors(context: Any) -> bool:
    """The stream's `triton_grpc_error` header is "true" (Triton compares it exactly [S])."""
    for key, value in context.invocation_metadata() or ():
        if key == "triton_grpc_error":
            return bool(value == "true")
    return False


# How many answers of one stream may wait for the client: past it, the stream's requests stop
# taking responses from their workers, whose queues fill, and the models' `send()` blocks
# (bridge/models/endpoint.py RESPONSES_AHEAD). What gRPC's own flow control already holds
# comes on top; 32 absorbs a burst of one request while a slow client costs at most 32 answers here.
STREAM_ANSWERS_AHEAD = 32


class _Outbox:
    """The answers of one ModelStreamInfer call on their way to its client, bounded.

    An error is an answer carrying its text (`error_message`), or, when `errors_end_stream`,
    the DoorError itself, which ends the call with its status.
    """

    def __init__(self, errors_end_stream: bool = False) -> None:
        self._answers: asyncio.Queue[StreamAnswer | DoorError | None]
        self._answers = asyncio.Queue()
        self._room = asyncio.Semaphore(STREAM_ANSWERS_AHEAD)
        self.errors_end_stream = errors_end_stream

    async def put(self, answer: StreamAnswer | DoorError) -> None:
        await self._room.acquire()
        self._answers.put_nowait(answer)

    async def fail(self, error: DoorError) -> None:
        if self.errors_end_stream:
            await self.put(error)
        else:
            await self.put(pb.ModelStreamInferResponse(error_message=wire_text(error.message)))

    def end(self) -> None:
        """No answer follows (never waits: the end is not counted)."""
        self._answers.put_nowait(None)

    async def take(self) -> list[StreamAnswer | DoorError] | None:
        """Every answer ready now, at least one (waiting for it), up to and including the first
        DoorError; None at the end."""
        answers = self._answers
        first = await answers.get()
        if first is None:
            return None
        batch = [first]
        while not isinstance(batch[-1], DoorError) and not answers.empty():
            answer = answers.get_nowait()
            if answer is None:  # the end: the next take says so
                answers.put_nowait(None)
                break
            batch.append(answer)
        for _ in batch:
            self._room.release()
        return batch


def _response(
    request: pb.ModelInferRequest,
    item: dict,
    final: bool | None = None,
    shm: SharedMemory | None = None,
    batching: bool = False,
) -> Answer:
    """A worker's answer item as the door sends it (wire.py: large raw contents outside)."""
    raw: list[bytes | bytearray] = []
    return framed(to_infer_response(request, item, final, shm, raw, batching), raw)


async def _placed_response(
    shm: SharedMemory,
    request: pb.ModelInferRequest,
    item: dict,
    final: bool | None,
    batching: bool,
) -> Answer:
    """`_response`, of a unary call (`final` None) or of a stream. When a region is registered
    its outputs may go into one, and a copy past OFF_LOOP_BYTES is not the loop's to make."""
    if shm.any_registered() and tensor_bytes(item) > OFF_LOOP_BYTES:
        return await run_off_loop(functools.partial(_response, request, item, final, shm, batching))
    return _response(request, item, final, shm, batching)


def _batching(target: Any) -> bool:
    """Does the model batch (classification ranks each batch entry on its own)?"""
    return bool(target.entry.config.max_batch_size > 0)


def _setting(value: pb.LogSettingsRequest.SettingValue) -> bool | int | str | None:
    """A LogSettings value as Python (None: the client set none, Triton's type error)."""
    kind = value.WhichOneof("parameter_choice")
    return getattr(value, kind) if kind else None


async def _answer(context: Any, handler: Callable[[Any], Awaitable[Any]], request: Any) -> Any:
    """Run a unary handler; a DoorError becomes its gRPC status and Triton's text."""
    if request is MALFORMED:
        await context.abort(grpc.StatusCode.INTERNAL, UNPARSABLE)
    try:
        return await handler(request)
    except DoorError as exc:
        await context.abort(grpc_status(exc.code), wire_text(exc.message))


async def _converted(service: TritonService, received: InferRequest, target: Any) -> dict:
    """The request in the bridge form. Reading inputs out of shared memory regions copies
    them (from a file, or off a GPU), which the size the client named makes as long as it
    likes: past OFF_LOOP_BYTES the whole conversion runs on a thread, its deferred BYTES
    checks last there. Otherwise only large BYTES inputs are checked off the event loop."""
    convert = functools.partial(
        to_bridge_request,
        received.message,
        target.version,
        target.entry.config,
        service.shm,
        service.bytes_limits,
        lend=service.lends(target),
        raw_contents=received.raw,
    )
    if service.shm.any_registered() and region_input_bytes(received.message) > OFF_LOOP_BYTES:
        return await run_off_loop(functools.partial(_convert_here, convert))
    deferred: list[Callable[[], None]] = []
    body = convert(deferred=deferred)
    await run_deferred(deferred)
    return body


def _convert_here(convert: Callable[..., dict]) -> dict:
    """`convert` with its deferred checks run after it, as the loop's way runs them (the same
    refusal for a request with several faults)."""
    deferred: list[Callable[[], None]] = []
    body = convert(deferred=deferred)
    run_deferred_here(deferred)
    return body


def _traceparent(context: Any) -> str:
    """The client's W3C trace context (`traceparent` metadata), or ""."""
    for key, value in context.invocation_metadata() or ():
        if key == "traceparent":
            return str(value)
    return ""
