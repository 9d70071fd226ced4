"""Bare gRPC servers: what Python gRPC costs before the door does anything (issue 27, item 5).

Each kind answers Triton's ModelInfer for the benchmark models (`add_sub` computes, the others
echo their inputs) straight from `raw_input_contents`, with numpy, and says yes to the health
calls; nothing else (no validation, no Dynamo, no loader, no statistics). They differ only in
the server and in where the model's arithmetic runs:

* `aio`: grpc.aio on uvloop, the arithmetic inline in the RPC's coroutine: the ceiling of any
  grpc.aio door.
* `aio_hop`: grpc.aio on uvloop, the arithmetic on one "instance" thread and the answer back on
  the loop: the door's two crossings.
* `sync`: grpc.server with a thread pool, the arithmetic inline on the RPC's thread, one at a
  time (a lock stands for the one instance, run directly when it is idle).
* `sync_hop`: grpc.server with a thread pool, the arithmetic on one "instance" thread while the
  RPC's thread waits for it.

So `aio_hop ÷ aio` is what the door's crossings cost on this machine, and `sync ÷ aio_hop` is
what a synchronous server whose RPC thread runs an idle instance's `execute` directly would win
or lose against the door's execution model, before the door's own work.

    python -m benchmarks.grpc_floor --kind sync --model-repository benchmarks/repository \
        --grpc-port 8001 --metrics-port 8002
    python -m benchmarks.run --workloads fp32_4,add_sub --concurrency 1,32 \
        --servers triton,door,floor_aio,floor_aio_hop,floor_sync,floor_sync_hop
"""

from __future__ import annotations

import argparse
import asyncio
import os
import queue
import signal
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb

SERVICE = "inference.GRPCInferenceService"
KINDS = ("aio", "aio_hop", "sync", "sync_hop")
MAX_MESSAGE = 2**31 - 1


def _answer(request: Any) -> pb.ModelInferResponse:
    """The model's work: numpy views of the inputs in, outputs as raw bytes out."""
    arrays = [np.frombuffer(raw, dtype=np.float32) for raw in request.raw_input_contents]
    if request.model_name == "add_sub":
        a, b = arrays
        outputs = [a + b, a - b]
    else:
        outputs = [array.copy() for array in arrays]
    response = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
    for index, (tensor, array) in enumerate(zip(request.inputs, outputs, strict=True)):
        out = response.outputs.add()
        out.name = f"OUTPUT{index}"
        out.datatype = tensor.datatype
        out.shape.extend(tensor.shape)
        response.raw_output_contents.append(array.tobytes())
    return response


class InstanceThread:
    """One thread that runs work posted to it, as a thread instance runs `execute`."""

    def __init__(self) -> None:
        self._work: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        threading.Thread(target=self._run, daemon=True, name="instance").start()

    def post(self, work: Callable[[], None]) -> None:
        self._work.put(work)

    def _run(self) -> None:
        while True:
            self._work.get()()


def unary_handlers(
    infer: Callable[..., Any], model_ready: Callable[[str], bool] = lambda name: True
) -> dict[str, grpc.RpcMethodHandler]:
    """The RPCs a lab server answers (synchronous handlers): the health calls the benchmark
    waits on, and ModelInfer."""

    def live(request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    def ready(request: Any, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=True)

    def ready_model(request: Any, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=model_ready(request.name))

    def unary(fn: Callable[..., Any], request: Any, response: Any) -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(
            fn,
            request_deserializer=request.FromString,
            response_serializer=response.SerializeToString,
        )

    return {
        "ServerLive": unary(live, pb.ServerLiveRequest, pb.ServerLiveResponse),
        "ServerReady": unary(ready, pb.ServerReadyRequest, pb.ServerReadyResponse),
        "ModelReady": unary(ready_model, pb.ModelReadyRequest, pb.ModelReadyResponse),
        "ModelInfer": unary(infer, pb.ModelInferRequest, pb.ModelInferResponse),
    }


def _async(fn: Callable[..., Any]) -> Callable[..., Any]:
    async def handler(request: Any, context: Any) -> Any:
        return fn(request, context)

    return handler


_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.so_reuseport", 0),
]


async def _serve_aio(kind: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    instance = InstanceThread()

    async def infer_inline(request: Any, context: Any) -> pb.ModelInferResponse:
        return _answer(request)

    async def infer_hop(request: Any, context: Any) -> pb.ModelInferResponse:
        done: asyncio.Future[pb.ModelInferResponse] = loop.create_future()

        def work() -> None:
            response = _answer(request)
            loop.call_soon_threadsafe(done.set_result, response)

        instance.post(work)
        return await done

    infer = infer_inline if kind == "aio" else infer_hop
    methods = {
        name: handler if name == "ModelInfer" else _health_async(handler)
        for name, handler in unary_handlers(infer).items()
    }
    server = grpc.aio.server(options=_OPTIONS)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, methods),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(0.5)


def _health_async(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    return grpc.unary_unary_rpc_method_handler(
        _async(handler.unary_unary),
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def _serve_sync(kind: str, port: int, workers: int) -> None:
    idle = threading.Lock()  # the one instance, free or busy
    instance = InstanceThread()

    def infer_inline(request: Any, context: Any) -> pb.ModelInferResponse:
        with idle:
            return _answer(request)

    def infer_hop(request: Any, context: Any) -> pb.ModelInferResponse:
        done: futures.Future[pb.ModelInferResponse] = futures.Future()
        instance.post(lambda: done.set_result(_answer(request)))
        return done.result()

    methods = unary_handlers(infer_inline if kind == "sync" else infer_hop)
    serve_sync(futures.ThreadPoolExecutor(max_workers=workers), methods, port)


def serve_sync(
    pool: futures.ThreadPoolExecutor, methods: dict[str, grpc.RpcMethodHandler], port: int
) -> None:
    """A synchronous grpc.server with `methods` on 127.0.0.1:`port`, until SIGINT or SIGTERM."""
    server = grpc.server(pool, options=_OPTIONS)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, methods),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    server.stop(0.5).wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.grpc_floor")
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--model-repository", type=Path)  # accepted, as the harness passes it
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)  # accepted, unused
    parser.add_argument("--workers", type=int, default=int(os.environ.get("FLOOR_WORKERS", "16")))
    args = parser.parse_args(argv)
    # As the bridge does at start-up (bridge/tuning.py): large buffers stay in the C heap, and a
    # woken thread does not preempt the one holding the GIL.
    from bridge.tuning import batch_scheduling, keep_large_buffers

    keep_large_buffers()
    batch_scheduling()
    if args.kind.startswith("aio"):
        import uvloop

        uvloop.run(_serve_aio(args.kind, args.grpc_port))
    else:
        _serve_sync(args.kind, args.grpc_port, args.workers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
