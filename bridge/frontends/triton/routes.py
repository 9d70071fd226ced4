"""How the door reaches the worker that serves a model endpoint: a route per endpoint.

Both routes take the bridge-form request body the wire built and a `dynamo.runtime.Context` the
caller stops when its client goes away, and give the worker's bridge-form response items up to
and including the final one (docs/worker_protocol.md §2):

* `LocalRoute`: the endpoint is served by a `ModelWorker` of this very process (the embedded
  default, `--role all`). Its `generate` is called directly: no msgpack transcode of the
  tensors, no socket, no second copy of the request; a unary call takes `answer`, which
  skips the stream's machinery. The worker polls the same `Context` for
  cancellation as it polls the request plane's, so stopping it behaves alike. The models stay
  registered with Dynamo: other frontends still reach them over the request plane.
* `RequestPlaneRoute`: another bridge worker's endpoint, through Dynamo's request plane
  (round robin over the endpoint's instances, `Instances`).
* `StandardFormRoute`: the endpoint of a TensorBased worker that is not a bridge worker
  (model_cards.py): Dynamo's standard form on the request plane, converted at the door
  (foreign.py).

Which instance a request-plane route sends to, and which instances it leaves out (gone, or
unreachable and ejected until they answer a ping), is `Instances`' (bridge/cluster/instances.py);
BLS calls into other workers choose the same way (bridge/cluster/remote_models.py).

A replica that is stopping may refuse a request before it took it (Dynamo's request plane says
"Worker disconnected before response stream was established", or "Worker removed before request
could be sent"; a bridge worker answers UNAVAILABLE "... is being unloaded", rejected: measured
with three replicas, two stopped in turn under load, 1 to 6 of about 4500 requests). Nothing
ran, so the request plane routes try it again (`NOT_TAKEN_RETRIES`), as Dynamo's own frontend
lost none of them; an error after the first item, or any other error, is the caller's.

After a reload the retired generation's route may still be used by requests already on their
way (in-process the directory is told of the change at once; across processes it moves on
within its refresh period, or when a request meets the withdrawn endpoint); a retired worker
hands a late request to the model now serving the name, or answers it NOT_FOUND, exactly as it
does one that arrives over the request plane.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from dynamo.runtime import Context

from model_repository_loader.pb_utils.errors import ErrorCode

from ...cluster.instances import Instances
from ...cluster.protocol import read_error
from ...transport.arrival import arrived_late, stamp
from ...transport.shm_exchange import ShmDoor
from ...transport.shm_regions import RegionError
from .foreign import bridge_items, to_standard_request


class Route(Protocol):
    def generate(self, body: dict, context: Context) -> AsyncIterator[dict]: ...


class LocalRoute:
    """A model endpoint served by this process: its worker's handler, called in-process."""

    __slots__ = ("worker",)

    def __init__(self, worker: Any) -> None:
        self.worker = worker  # a bridge.models.endpoint.ModelWorker

    def generate(self, body: dict, context: Context) -> AsyncIterator[dict]:
        # The handler ends right after its final item (a bridge-form request): no wrapper.
        return self.worker.generate(body, context)

    async def answer(self, body: dict, context: Context) -> list[dict]:
        """What `generate` gives, at once: a unary call's cheaper path (ModelWorker.answer)."""
        answers: list[dict] = await self.worker.answer(body, context)
        return answers

    def on_thread(self) -> Any:
        """A call of `answer_on_thread` to come: its `cancel()` (any thread) gives it up."""
        return self.worker.thread_answer()

    def answer_on_thread(self, request: Any, answer: Any, encode: Any) -> list[Any]:
        """The loader's `request` answered for a caller on a thread that may wait
        (grpc/unary.py), with `answer` from `on_thread` and `encode` making each response what
        the caller sends: the encoded responses and errors, [] once cancelled
        (ModelWorker.answer_on_thread)."""
        answers: list[Any] = self.worker.answer_on_thread(request, answer, encode)
        return answers


# The request plane's texts for a request a stopping replica never took (measured on 1.6.1).
NOT_TAKEN = (
    "before response stream was established",  # refused by the replica
    "before request could be sent",  # its instance record was withdrawn meanwhile
)
NOT_TAKEN_RETRIES = 3
NOT_TAKEN_PAUSE_S = 0.05  # lets the client see the replica's record withdrawn


def _not_started(item: Any) -> bool:
    """A bridge worker's answer for a request the model never saw, which another replica may
    take: the version is being unloaded (a replica stopping;
    model_repository_loader.model.unavailable_text), or the request reached the worker late
    enough that it took this caller for gone (bridge/transport/arrival.py)."""
    error = item.get("error") if isinstance(item, dict) else None
    if not isinstance(error, dict) or not item.get("rejected"):
        return False
    code, message = read_error(error)
    return code == ErrorCode.UNAVAILABLE and (
        message.endswith("is not ready: it is being unloaded") or arrived_late(message)
    )


async def _first_taker(
    start: Callable[[], Awaitable[Any]],
    context: Context,
    refused: Callable[[Any], bool] = lambda item: False,
) -> AsyncIterator[Any]:
    """The items of `start()`'s stream; started again (at most NOT_TAKEN_RETRIES times) while a
    stopping replica refuses it before its first item (an exception, or a first item that
    `refused` recognises)."""
    for attempt in range(NOT_TAKEN_RETRIES + 1):
        taken = False
        try:
            async for item in await start():
                if not taken and refused(item):
                    if attempt < NOT_TAKEN_RETRIES and not context.is_stopped():
                        break  # another replica, below
                taken = True
                yield item
            else:
                return
        except Exception as exc:
            if taken or attempt == NOT_TAKEN_RETRIES or not any(t in str(exc) for t in NOT_TAKEN):
                raise
            if context.is_stopped():
                raise
        await asyncio.sleep(NOT_TAKEN_PAUSE_S)


class RequestPlaneRoute:
    """A model endpoint reached over Dynamo's request plane; with `shm`, an instance on the
    door's host gets the tensors through shared memory (bridge/transport/shm_exchange.py)."""

    __slots__ = ("instances", "shm", "answer_bytes")

    def __init__(self, client: Any, shm: ShmDoor | None = None) -> None:
        self.instances = Instances(client)
        self.shm = shm
        # The size of the last answer (0: inline; None: none yet): what the next request offers.
        self.answer_bytes: int | None = None

    async def generate(self, body: dict, context: Context) -> AsyncIterator[dict]:
        exchange = self.shm.exchange(self.answer_bytes) if self.shm is not None else None
        shape = exchange.request_for if exchange is not None else None

        def start() -> Awaitable[Any]:
            return self.instances.open(stamp(body), context, shape)

        def refused(item: Any) -> bool:  # sent again: to another replica, or in bytes
            return _not_started(item) or (exchange is not None and exchange.refused(item))

        answered = False
        try:
            if exchange is not None:
                await exchange.prepare(body, self.instances.client.instance_ids())
            async for item in _first_taker(start, context, refused=refused):
                if exchange is not None:
                    try:
                        item = await exchange.take(item)
                    except (RegionError, OSError) as exc:
                        yield {"error": {"code": "INTERNAL", "message": str(exc)}, "final": True}
                        return
                yield item
                if item.get("final", False):
                    answered = True
                    return  # the item that ends it: no need to wait for the stream's own end
        finally:
            if exchange is not None:
                exchange.close(answered)
                if exchange.answer_bytes is not None:
                    self.answer_bytes = exchange.answer_bytes


class StandardFormRoute:
    """A model endpoint of a worker that speaks only Dynamo's standard tensor form."""

    __slots__ = ("instances", "model")

    def __init__(self, client: Any, model: str) -> None:
        self.instances = Instances(client, pingable=False)  # not a bridge worker
        self.model = model

    async def generate(self, body: dict, context: Context) -> AsyncIterator[dict]:
        request = to_standard_request(body)

        def start() -> Awaitable[Any]:
            return self.instances.open(request, context)

        async for item in bridge_items(_first_taker(start, context), self.model):
            yield item
            if item.get("final", False):
                return
