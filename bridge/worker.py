"""One loaded model served as one Dynamo TensorBased endpoint.

The endpoint is registered with the serialized Triton `ModelConfig` as `triton_model_config`, so
the KServe frontend answers ModelConfig and ModelMetadata exactly from it. Requests arrive on the
runtime's event loop; the handler only decodes and queues them, and the model runs on its
instance threads (model_repository_loader), so the loop never waits on model code.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import AsyncIterator
from typing import Any

from dynamo.llm import ModelInput, ModelType, WorkerType, register_model, unregister_model
from dynamo.runtime import DistributedRuntime, Endpoint
from tritonclient.grpc import model_config_pb2 as mc

from model_repository_loader.model import Model
from model_repository_loader.pb_utils import InferenceResponse, TritonError

from .codec import TO_DYNAMO, decode_request, encode_response
from .errors import to_dynamo_exception

_CONFIG_DTYPE_TO_KSERVE = {
    name: ("BYTES" if name == "TYPE_STRING" else name.removeprefix("TYPE_"))
    for name in mc.DataType.keys()
    if name != "TYPE_INVALID"
}


def component_name(model_name: str) -> str:
    """A Dynamo-safe component name for a model: `[a-z0-9_-]`, unique per model name.

    Discovery matches endpoint paths by prefix, so a short hash of the exact name keeps `m` and
    `m_2` (or `M` and `m`) apart.
    """
    slug = re.sub(r"[^a-z0-9_-]+", "-", model_name.lower()).strip("-")[:40] or "model"
    digest = hashlib.sha1(model_name.encode()).hexdigest()[:8]
    return f"{slug}-{digest}"


def tensor_model_config(model_name: str, config: mc.ModelConfig) -> dict[str, Any]:
    """What `register_model` needs for a TensorBased model, the Triton config included."""
    batch = [-1] if config.max_batch_size > 0 else []

    def describe(tensors: Any) -> list[dict[str, Any]]:
        return [
            {
                "name": t.name,
                "data_type": TO_DYNAMO[_CONFIG_DTYPE_TO_KSERVE[mc.DataType.Name(t.data_type)]],
                "shape": batch + list(t.dims),
            }
            for t in tensors
        ]

    return {
        "name": model_name,
        "inputs": describe(config.input),
        "outputs": describe(config.output),
        "triton_model_config": config.SerializeToString(),
    }


class ModelWorker:
    """Registers a model with Dynamo and answers its requests."""

    def __init__(self, runtime: DistributedRuntime, namespace: str, model: Model) -> None:
        self.model = model
        self.name = model.name
        self.endpoint: Endpoint = runtime.endpoint(
            f"{namespace}.{component_name(model.name)}.generate"
        )
        self._serving: asyncio.Future[Any] | None = None

    async def start(self) -> None:
        # Serve first, then advertise: a request routed here finds a handler.
        self._serving = asyncio.ensure_future(self.endpoint.serve_endpoint(self.generate))
        await register_model(
            ModelInput.Tensor,
            ModelType.TensorBased,
            self.endpoint,
            self.name,
            self.name,
            worker_type=WorkerType.Aggregated,
            tensor_model_config=tensor_model_config(self.name, self.model.config),
        )

    async def stop(self) -> None:
        """Stop advertising the model; requests already routed here still finish."""
        await unregister_model(self.endpoint)

    async def generate(self, request: dict[str, Any], context: Any) -> AsyncIterator[dict]:
        loop = asyncio.get_running_loop()
        responses: asyncio.Queue[tuple[dict | TritonError | None, bool]] = asyncio.Queue()
        name = self.name

        def respond(response: InferenceResponse | None, final: bool) -> None:
            # Runs on the model's thread: encode there, so the event loop only hands over.
            if response is not None and response.has_error():
                item: dict | TritonError | None = response.error()
            else:
                item = encode_response(name, response) if response is not None else None
            loop.call_soon_threadsafe(responses.put_nowait, (item, final))

        self.model.submit(decode_request(request), respond)
        while True:
            item, final = await responses.get()
            if isinstance(item, TritonError):
                raise to_dynamo_exception(item)
            if item is not None:
                yield item
            if final:
                return
