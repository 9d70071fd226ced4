"""ModelInfer to a model this process serves, from request to answer on the call's own thread.

The synchronous gRPC server (server.py) runs each unary call on a thread of its pool. For a
request to this process's own worker, that thread does all of it: the wire's checks and the
conversion straight into the loader's request (tensors.py `to_loader_request`, Triton's
texts), `Model.submit` (ModelWorker.answer_on_thread), and a wait for the model's final
response, which the model's thread made into the answer's protobuf as it sent it
(`answer_of`). Nothing of it touches the event loop, which is where grpc.aio spent most of a
small request's CPU, and no bridge form is made on the way (issue 37, docs/benchmarks.md).

What the loop's path does is kept: the restricted-protocol interceptor runs before any handler;
header forwarding; the shutdown's count (`service.calls`) and the worker's drain count;
cancellation and deadlines (gRPC's call-end callback cancels the request for the model);
statistics, the response cache and the rate limiter (the loader's, in `Model.submit`).

The loop's path (servicer.py, through on_loop.py) takes what needs the loop or is rare: a
malformed request, any request while tracing is on, a request naming shared memory regions, a
model served by another process, and a model the cached index cannot vouch for (a lookup that
must ask the workers, `TritonService.target_now`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

import grpc

from model_repository_loader.pb_utils import TritonError
from model_repository_loader.pb_utils.errors import ErrorCode
from model_repository_loader.validation import RequestError

from ....errors import request_failed
from ..door_error import DoorError
from .error_status import grpc_status, wire_text
from .on_loop import on_loop_unary
from .servicer import Answer, TritonServicer
from .tensors import answer_of, class_counts, to_loader_request
from .wire import MALFORMED, InferRequest


class ModelInferOnThread:
    """The synchronous ModelInfer handler (module doc)."""

    def __init__(self, servicer: TritonServicer, loop: asyncio.AbstractEventLoop) -> None:
        self._servicer = servicer
        self._on_loop: Callable[[Any, grpc.ServicerContext], Any] = on_loop_unary(
            servicer.ModelInfer, loop
        )

    def __call__(self, received: Any, context: grpc.ServicerContext) -> Answer:
        service = self._servicer.service
        if received is MALFORMED or service.trace.active:
            return self._on_loop(received, context)
        try:
            with service.calls:  # a shutdown waits for it
                answer = self._answer(received, context)
        except DoorError as exc:
            context.abort(grpc_status(exc.code), wire_text(exc.message))
        return self._on_loop(received, context) if answer is None else answer

    def _answer(self, received: InferRequest, context: grpc.ServicerContext) -> Answer | None:
        """The answer, or None when the loop's path must take the request."""
        service = self._servicer.service
        request = received.message
        target = service.target_now(request.model_name, request.model_version, stream=False)
        route = None if target is None else service.directory.local_route(target.endpoint)
        if target is None or route is None:
            return None
        config = target.entry.config
        try:
            inference = to_loader_request(
                request,
                target.version,
                config,
                service.bytes_limits,
                received.raw,
                functools.partial(self._servicer.forwarded, context),
            )
            if inference is None:  # it names shared memory regions
                return None
        except RequestError as exc:  # refused as the worker refuses it: its one log line
            request_failed(request.model_name, request.id, TritonError(exc.message, exc.code))
            raise DoorError(exc.code, exc.message) from None
        answer = route.on_thread()
        if not context.add_callback(answer.cancel):  # the call has ended already
            answer.cancel()
        classes = class_counts(request) if request.outputs else {}
        encode = functools.partial(answer_of, request, classes, config.max_batch_size > 0)
        try:
            answers = route.answer_on_thread(inference, answer, encode)
        except Exception as exc:  # as TritonService.answers words a failure of the worker
            raise DoorError(ErrorCode.UNAVAILABLE, str(exc)) from None
        if answer.gone:  # the call ended first: gRPC sends nothing more
            context.abort(grpc.StatusCode.CANCELLED, "the call ended")
        if len(answers) != 1:
            raise DoorError(ErrorCode.INTERNAL, f"expected a single response, got {len(answers)}")
        if isinstance(answers[0], TritonError):
            raise DoorError(answers[0].code(), answers[0].message())
        return answers[0]
