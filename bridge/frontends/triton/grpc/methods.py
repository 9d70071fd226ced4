"""The method table of the door's synchronous gRPC server: each RPC's (de)serializers, its
handler, and the pool of threads it runs on, each pool bounded.

The table is built from the service descriptor in tritonclient's generated module, with two
changes: a request that is not a valid protobuf deserializes to a marker, so the RPC answers
Triton's INTERNAL "Unable to parse request" (and a stream carries it in-band and goes on)
instead of gRPC's own failure; and an inference request's tensor bytes are read without the
parser's copies, and large answers' without the serializer's (wire.py).

The threads (gRPC Python runs an RPC on the pool its handler function carries,
`experimental_thread_pool`, else on the server's):
- ModelInfer on the server's pool of `--grpc-infer-threads` (INFER_THREADS by default). A call
  to this process's own model holds its thread while the model works (unary.py), so the pool
  has room for a batcher's worth of requests at once; an idle thread costs a parked thread, and
  calls past the pool wait for one.
- The other unary RPCs (health, metadata, repository, settings, shared memory) on a pool of
  OTHER_THREADS of their own, so inference calls held by slow models never keep a health check
  or a load waiting.
- Each open ModelStreamInfer on two threads (one sends its answers, one reads its requests) for
  as long as it is open, from pools of their own: at most `--grpc-max-streams` streams at once
  (MAX_STREAMS by default); one more is refused with RESOURCE_EXHAUSTED.

The calls the server holds at once, running or waiting for a thread, are capped at
`Threads.max_calls` (gRPC's `maximum_concurrent_rpcs`): every pool full, and as many ModelInfer
calls again waiting. One more call of any RPC is refused with RESOURCE_EXHAUSTED ("Concurrent
RPC limit exceeded!", gRPC's text) rather than queued without end: calls waiting for a thread
cost memory, and gRPC core lets one connection open any number of calls.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from .on_loop import on_loop_stream, on_loop_unary
from .servicer import TritonServicer
from .unary import ModelInferOnThread
from .wire import MALFORMED, read_infer_request, write_infer_response, write_stream_response

SERVICE = "inference.GRPCInferenceService"
INFER_THREADS = 1024
OTHER_THREADS = 16
MAX_STREAMS = 1024


def _tolerant(message: Any) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return message.FromString(data)
        except DecodeError:
            return MALFORMED

    return parse


_WRITERS: dict[type, Callable[[Any], bytes]] = {
    pb.ModelInferResponse: write_infer_response,
    pb.ModelStreamInferResponse: write_stream_response,
}


class Threads:
    """The pools the door's RPCs run on (module doc); `infer` is the server's own."""

    def __init__(self, max_streams: int = MAX_STREAMS, infer_threads: int = INFER_THREADS) -> None:
        self.max_streams = max_streams
        self.infer = futures.ThreadPoolExecutor(infer_threads, thread_name_prefix="grpc-infer")
        self.other = futures.ThreadPoolExecutor(OTHER_THREADS, thread_name_prefix="grpc-other")
        # A stream's answers are sent from its call's thread; past the seats a few more, so
        # that a refusal never waits behind the open streams.
        self.streams = futures.ThreadPoolExecutor(max_streams + 4, thread_name_prefix="grpc-stream")
        self.readers = futures.ThreadPoolExecutor(max_streams, thread_name_prefix="grpc-read")
        self._seats = threading.BoundedSemaphore(max_streams)
        # Every thread busy, and as many ModelInfer calls again waiting for one (module doc).
        self.max_calls = 2 * infer_threads + OTHER_THREADS + max_streams + 4

    def seated(self, handle: Callable[[Any, Any], Iterator[Any]]) -> Callable[..., Iterator[Any]]:
        """`handle` for a stream that holds a seat while it is open, on the streams' pool."""

        def stream(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
            if not self._seats.acquire(blocking=False):
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"too many open streams: the server takes at most {self.max_streams} at once",
                )
            try:
                yield from handle(requests, context)
            finally:
                self._seats.release()

        stream.experimental_thread_pool = self.streams  # type: ignore[attr-defined]
        return stream

    def on_other(self, handle: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        """`handle` (a function of its own, on_loop.py's) on the other unary RPCs' pool."""
        handle.experimental_thread_pool = self.other  # type: ignore[attr-defined]
        return handle

    def shutdown(self) -> None:
        """Once the server has stopped: idle threads end (none waits for work any more)."""
        for pool in (self.infer, self.other, self.streams, self.readers):
            pool.shutdown(wait=False, cancel_futures=True)


def method_handlers(
    servicer: TritonServicer, loop: asyncio.AbstractEventLoop, threads: Threads
) -> grpc.GenericRpcHandler:
    """Every RPC of Triton's GRPCInferenceService: ModelInfer on its calling thread as far as it
    can go (unary.py), the others' asynchronous handlers run on `loop` (on_loop.py)."""
    methods = {}
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        request = getattr(pb, method.input_type.name)
        response = getattr(pb, method.output_type.name)
        # ModelInfer and ModelStreamInfer: their tensor bytes are copied as little as possible.
        read = read_infer_request if request is pb.ModelInferRequest else _tolerant(request)
        write = _WRITERS.get(response, response.SerializeToString)
        handler = getattr(servicer, method.name)
        if method.client_streaming:
            stream = threads.seated(on_loop_stream(handler, loop, threads.readers))
            methods[method.name] = grpc.stream_stream_rpc_method_handler(
                stream, request_deserializer=read, response_serializer=write
            )
            continue
        if method.name == "ModelInfer":
            unary: Callable[[Any, Any], Any] = ModelInferOnThread(servicer, loop)
        else:
            unary = threads.on_other(on_loop_unary(handler, loop))
        methods[method.name] = grpc.unary_unary_rpc_method_handler(
            unary, request_deserializer=read, response_serializer=write
        )
    return grpc.method_handlers_generic_handler(SERVICE, methods)
