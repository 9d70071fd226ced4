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

After a reload the retired generation's route may still be used by requests already on their
way (in-process the directory is told of the change at once; across processes it moves on
within its refresh period, or when a request meets the withdrawn endpoint); a retired worker
hands a late request to the model now serving the name, or answers it NOT_FOUND, exactly as it
does one that arrives over the request plane.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
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


class RequestPlaneRoute:
    """A model endpoint reached over Dynamo's request plane."""

    __slots__ = ("client",)

    def __init__(self, client: Any) -> None:
        self.client = client  # a Dynamo endpoint client

    async def generate(self, body: dict, context: Context) -> AsyncIterator[dict]:
        stream = await self.client.round_robin(body, annotated=False, context=context)
        async for item in stream:
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
        stream = await self.client.round_robin(request, annotated=False, context=context)
        async for item in bridge_items(stream, self.model):
            yield item
            if item.get("final", False):
                return
