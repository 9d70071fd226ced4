"""How the door reaches the worker that serves a model endpoint: a route per endpoint.

Both routes take the bridge-form request body the wire built and a `dynamo.runtime.Context` the
caller stops when its client goes away, and give the worker's bridge-form response items up to
and including the final one (docs/worker_protocol.md §2):

* `LocalRoute`: the endpoint is served by a `ModelWorker` of this very process (the embedded
  default, `--role all`). Its `generate` is called directly: no msgpack transcode of the
  tensors, no socket, no second copy of the request. The worker polls the same `Context` for
  cancellation as it polls the request plane's, so stopping it behaves alike. The models stay
  registered with Dynamo: other frontends still reach them over the request plane.
* `RequestPlaneRoute`: another bridge worker's endpoint, through Dynamo's request plane
  (`round_robin` over the endpoint's instances).
* `StandardFormRoute`: the endpoint of a TensorBased worker that is not a bridge worker
  (model_cards.py): Dynamo's standard form on the request plane, converted at the door
  (foreign.py).

A replica that is stopping may refuse a request before it took it (Dynamo's request plane says
"Worker disconnected before response stream was established", or "Worker removed before request
could be sent"; a bridge worker answers UNAVAILABLE "... is being unloaded", rejected: measured
with three replicas, two stopped in turn under load, 1 to 6 of about 4500 requests). Nothing
ran, so the request plane routes try it again (`NOT_TAKEN_RETRIES`), as Dynamo's own frontend
lost none of them; an error after the first item, or any other error, is the caller's.

After a reload the retired generation's route may still be used for a moment (the directory
moves on within its refresh period); a retired worker hands a late request to the model now
serving the name, or answers it NOT_FOUND, exactly as it does one that arrives over the request
plane.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from dynamo.runtime import Context

from .foreign import bridge_items, to_standard_request


class Route(Protocol):
    def generate(self, body: dict, context: Context) -> AsyncIterator[dict]: ...


class LocalRoute:
    """A model endpoint served by this process: its worker's handler, called in-process."""

    __slots__ = ("worker",)

    def __init__(self, worker: Any) -> None:
        self.worker = worker  # a bridge.worker.ModelWorker

    def generate(self, body: dict, context: Context) -> AsyncIterator[dict]:
        # The handler ends right after its final item (a bridge-form request): no wrapper.
        return self.worker.generate(body, context)


# The request plane's texts for a request a stopping replica never took (measured on 1.6.1).
NOT_TAKEN = (
    "before response stream was established",  # refused by the replica
    "before request could be sent",  # its instance record was withdrawn meanwhile
)
NOT_TAKEN_RETRIES = 3
NOT_TAKEN_PAUSE_S = 0.05  # lets the client see the replica's record withdrawn


def _unloading(item: Any) -> bool:
    """A bridge worker's answer for a request that reached a version it is unloading (a replica
    stopping): rejected before the model saw it (model_repository_loader.model.unavailable_text)."""
    error = item.get("error") if isinstance(item, dict) else None
    return (
        isinstance(error, dict)
        and error.get("code") == "UNAVAILABLE"
        and bool(item.get("rejected"))
        and str(error.get("message", "")).endswith("is not ready: it is being unloaded")
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
    """A model endpoint reached over Dynamo's request plane."""

    __slots__ = ("client",)

    def __init__(self, client: Any) -> None:
        self.client = client  # a Dynamo endpoint client

    async def generate(self, body: dict, context: Context) -> AsyncIterator[dict]:
        def start() -> Awaitable[Any]:
            return self.client.round_robin(body, annotated=False, context=context)

        async for item in _first_taker(start, context, refused=_unloading):
            yield item
            if item.get("final", False):
                return  # the item that ends it: no need to wait for the stream's own end


class StandardFormRoute:
    """A model endpoint of a worker that speaks only Dynamo's standard tensor form."""

    __slots__ = ("client", "model")

    def __init__(self, client: Any, model: str) -> None:
        self.client = client  # a Dynamo endpoint client
        self.model = model

    async def generate(self, body: dict, context: Context) -> AsyncIterator[dict]:
        request = to_standard_request(body)

        def start() -> Awaitable[Any]:
            return self.client.round_robin(request, annotated=False, context=context)

        async for item in bridge_items(_first_taker(start, context), self.model):
            yield item
            if item.get("final", False):
                return
