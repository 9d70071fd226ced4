"""LAB ONLY: the door's unary ModelInfer on a synchronous gRPC server (issue 27, item 5).

Not a product path and not reachable from `python -m bridge`: it measures what a synchronous
unary path would win over the triton door's grpc.aio one, with the same model code and the same
conversions, so that `door_sync ÷ door` is the price of the door's event-loop machinery alone.

What it does, per ModelInfer, on one thread of a `grpc.server(ThreadPoolExecutor(N))`:
protobuf → the bridge form (the door's own `to_bridge_request`, grpc/tensors.py) → the loader's
`InferRequest` (the worker's own `decode_request`, bridge/codec.py) → `Model.submit` of the real
loader (model_repository_loader: validation, the model's scheduler, its instance thread, the
request's statistics, the response cache if configured) → the response encoded on the instance
thread (the worker's own `encode_bridge_response`) → a raw lock the RPC thread waits on → the
door's own `to_infer_response`. ServerLive, ServerReady and ModelReady answer true (ModelReady:
for a loaded model); nothing else is served.

An earlier `--direct` variant ran an idle instance's `execute` on the RPC thread itself; it
saved no CPU (docs/benchmarks.md, "Issue 27, items 1, 2 and 5") and was removed.

What the real door does per request that this does NOT (so the comparison is fair only with
this list in mind):

* no Dynamo: no runtime, no discovery, no endpoint, no `Context`, no directory lookup
  (`TritonService.target`: model/version/readiness checks, decoupled-through-unary refusal,
  the "exiting" refusal), no route (`LocalRoute`) and its retry on a withdrawn endpoint;
* no restricted-protocol interceptor (`--grpc-restricted-protocol`), no header forwarding
  (`--grpc-header-forward-pattern`), no TLS, no connection cap or handshake timeout, no
  malformed-protobuf marker (gRPC's own deserialization error instead of Triton's text);
* no system shared memory (`SystemSharedMemory*` RPCs, `holding`, lending regions, writing
  outputs into them), no CUDA shared memory answers;
* no tracing (`--trace-*`, `traceparent`, the trace's timestamps), no `service.calls` count a
  shutdown waits for, no graceful shutdown (SIGTERM stops the server after 0.5 s);
* no cancellation: a client that cancels or whose deadline passes leaves its request running
  (the door stops its Dynamo context, the worker cancels `Pending`); no worker backpressure
  (`_Responses`' bounded queue; a unary call has one response anyway);
* no off-loop decoding of large or BYTES requests (`decode_request_in_slices`, the bytes
  decoder thread, `run_deferred`): everything is decoded on the RPC thread, which has no loop
  to keep free;
* no ModelStreamInfer, metadata, config, statistics, repository, log or trace RPCs; no HTTP
  wire, no metrics endpoint (`--metrics-port` is accepted and unused), no hot reload, no
  retirement/draining of a model generation, no `request_failed` wording of model errors;
* the statistics the loader itself keeps (queue, compute, counts) ARE kept: they are part of
  `submit`.

    python -m benchmarks.door_sync --model-repository benchmarks/repository --grpc-port 8001
    python -m benchmarks.run --workloads fp32_4,add_sub --concurrency 1,32 \
        --servers triton,door,door_sync,floor_aio_hop,floor_sync
"""

from __future__ import annotations

import argparse
import functools
import os
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any, NoReturn

import grpc
from tritonclient.grpc import service_pb2 as pb

from benchmarks.grpc_floor import serve_sync, unary_handlers
from bridge.codec import decode_request, encode_bridge_response
from bridge.frontends.triton.door_error import DoorError
from bridge.frontends.triton.grpc.error_status import grpc_status, wire_text
from bridge.frontends.triton.grpc.tensors import to_bridge_request, to_infer_response
from bridge.serialized_bytes import BytesLimits
from model_repository_loader import pb_utils
from model_repository_loader.config import ConfigOptions
from model_repository_loader.loader import LoadedRepository, load_repository
from model_repository_loader.model import ServedModel
from model_repository_loader.pb_utils.errors import ErrorCode
from model_repository_loader.validation import RequestError, parse_model_version


class _Answer:
    """One unary request's answer, handed from the instance thread to the waiting RPC thread.

    A raw lock held from the start and released by the final response is the cheapest wait
    CPython has (a threading.Event or a Future adds a Condition and its own lock)."""

    __slots__ = ("_encode", "_done", "items")

    def __init__(self, encode: Callable[[pb_utils.InferenceResponse, bool], dict]) -> None:
        self._encode = encode
        self._done = threading.Lock()
        self._done.acquire()
        self.items: list[dict | pb_utils.TritonError] = []

    def respond(self, response: pb_utils.InferenceResponse | None, final: bool) -> None:
        """The loader's `Respond`, on the instance thread (or this one, for early errors)."""
        try:
            if response is not None:
                error = response.error()
                if error is not None:
                    self.items.append(error)
                else:
                    self.items.append(self._encode(response, final))
        except Exception as exc:  # the wire cannot carry it: fail the call, never hang it
            self.items.append(pb_utils.TritonError(f"encoding failed: {exc!r}"))
        finally:
            if final:
                self._done.release()

    def wait(self) -> None:
        self._done.acquire()


class DoorSync:
    """The RPC handlers over a loaded repository (module doc)."""

    def __init__(self, loaded: LoadedRepository) -> None:
        self.models: dict[str, ServedModel] = loaded.models
        self.limits = BytesLimits()

    def model_infer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        name = request.model_name
        model = self.models.get(name)
        if model is None:
            message = f"Request for unknown model: '{name}' is not found"
            _abort(context, ErrorCode.NOT_FOUND, message)
        try:
            body = to_bridge_request(
                request, request.model_version, model.config, None, self.limits
            )
            inference = decode_request(body, name, self.limits)
            inference.model_version = parse_model_version(request.model_version)
        except DoorError as exc:
            _abort(context, exc.code, exc.message)
        except RequestError as exc:
            _abort(context, ErrorCode(exc.code), exc.message)
        version = str(inference.model_version) if inference.model_version != -1 else ""
        if not version:
            version = str(getattr(getattr(model, "latest", None), "version", ""))
        answer = _Answer(functools.partial(encode_bridge_response, name, version))
        model.submit(inference, answer.respond)
        answer.wait()
        items = answer.items
        if len(items) != 1:
            _abort(context, ErrorCode.INTERNAL, f"expected a single response, got {len(items)}")
        item = items[0]
        if isinstance(item, pb_utils.TritonError):
            _abort(context, ErrorCode(item.code()), item.message())
        return to_infer_response(request, item)

    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        return unary_handlers(self.model_infer, lambda name: name in self.models)


def _abort(context: Any, code: ErrorCode, message: str) -> NoReturn:
    context.abort(grpc_status(code), wire_text(message))
    raise AssertionError("grpc's abort() raises")


# -- the process -----------------------------------------------------------------------------------


def serve(repository: Path, port: int, workers: int) -> None:
    loaded = load_repository([repository], ConfigOptions())
    if loaded.failures:
        raise SystemExit(f"models failed to load: {loaded.failures}")
    door = DoorSync(loaded)
    _name_os_threads()
    pool = futures.ThreadPoolExecutor(
        max_workers=workers, initializer=_name_os_thread, initargs=("rpc",)
    )
    serve_sync(pool, door.handlers(), port)
    loaded.close(5.0)


def _name_os_thread(name: str, native_id: int | None = None) -> None:
    """A thread's name as the OS sees it (/proc/<pid>/task/<tid>/comm; this thread's by
    default): Python 3.11 leaves every thread "python", and a per-thread CPU count (top -H,
    /proc) must tell the RPC threads from the instance threads."""
    tid = threading.get_native_id() if native_id is None else native_id
    try:
        Path(f"/proc/self/task/{tid}/comm").write_text(name[:15])
    except OSError:
        pass


def _name_os_threads() -> None:
    """The loader's threads (`instance:<name>`, ...) by their Python names."""
    for thread in threading.enumerate():
        if thread.native_id is not None and thread is not threading.main_thread():
            _name_os_thread(thread.name, thread.native_id)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.door_sync")
    parser.add_argument("--model-repository", type=Path, required=True)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)  # accepted, unused
    parser.add_argument("--workers", type=int, default=int(os.environ.get("FLOOR_WORKERS", "16")))
    args = parser.parse_args(argv)
    # As the bridge does at start-up (bridge/tuning.py, bridge/server.py).
    from bridge.tuning import batch_scheduling, keep_large_buffers

    keep_large_buffers()
    batch_scheduling()
    serve(args.model_repository, args.grpc_port, args.workers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
