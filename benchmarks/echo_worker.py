"""The floor: bare Dynamo with the smallest Python handler that answers the benchmark models.

One process, like the bridge's embedded default: `DistributedRuntime("mem", "tcp")`, one
TensorBased endpoint per model of the repository, registered with the same
`tensor_model_config` (Triton config included) the bridge registers, and Dynamo's KServe gRPC
frontend in-process. The handler converts exactly as the bridge does, with the bridge's own
codec (`bridge.codec`: `decode_request` / `decode_request_in_slices` in, `encode_response`
out), and does the model's arithmetic inline. No loader, no validation, no scheduler, no
threads. So `bridge ÷ echo` is the loader's cost alone: whatever the bridge costs beyond this
process is the request's way through `model_repository_loader` and back.

    python -m benchmarks.echo_worker --model-repository benchmarks/repository \
        --grpc-port 8001 --metrics-port 8002
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bridge.codec import (
    LARGE_REQUEST_ELEMENTS,
    TO_KSERVE,
    decode_request,
    decode_request_in_slices,
    encode_response,
    request_elements,
)
from model_repository_loader.pb_utils import InferenceResponse, Tensor
from model_repository_loader.pb_utils.constants import DATATYPE_TO_NUMPY

Compute = Callable[[list[np.ndarray]], list[np.ndarray]]


def _identity(arrays: list[np.ndarray]) -> list[np.ndarray]:
    return arrays


def _add_sub(arrays: list[np.ndarray]) -> list[np.ndarray]:
    a, b = arrays
    return [a + b, a - b]


# What each benchmark model computes; models not named here echo their inputs.
COMPUTE: dict[str, Compute] = {"add_sub": _add_sub}


async def _decoded_arrays(request: dict[str, Any]) -> list[np.ndarray]:
    # The bridge's decode, with the same threshold for decoding a large request in slices.
    if request_elements(request) > LARGE_REQUEST_ELEMENTS:
        inference = await decode_request_in_slices(request)
    else:
        inference = decode_request(request)
    return [tensor.as_numpy() for tensor in inference.inputs]


def make_handler(
    model_name: str, tensor_config: dict[str, Any], decoupled: bool = False
) -> Callable[..., AsyncIterator]:
    """The endpoint handler for one model: outputs are named and typed from its config."""
    outputs = [(o["name"], o["data_type"]) for o in tensor_config["outputs"]]
    compute = COMPUTE.get(model_name, _identity)

    async def generate(request: dict[str, Any], context: Any) -> AsyncIterator[dict[str, Any]]:
        arrays = compute(await _decoded_arrays(request))
        tensors = [Tensor(name, array) for (name, _), array in zip(outputs, arrays, strict=True)]
        # With FINAL, as the bridge's worker encodes a response sent with the final flag.
        yield encode_response(model_name, InferenceResponse(tensors), True)

    async def stream(request: dict[str, Any], context: Any) -> AsyncIterator[dict[str, Any]]:
        # The decoupled benchmark model (stream_100): COUNT responses, OUT = 0..COUNT-1, each
        # encoded as the bridge encodes a streamed response (not the final one).
        (name, data_type), count = outputs[0], int((await _decoded_arrays(request))[0][0])
        dtype = DATATYPE_TO_NUMPY[TO_KSERVE[data_type]]
        for i in range(count):
            response = InferenceResponse([Tensor(name, np.array([i], dtype=dtype))])
            yield encode_response(model_name, response, False)

    return stream if decoupled else generate


async def serve(repository_path: Path, grpc_port: int, metrics_port: int) -> None:
    # Imported here: Dynamo reads DYN_LOG when it is first imported (set in main()).
    from dynamo.llm import ModelInput, ModelType, WorkerType, register_model
    from dynamo.runtime import DistributedRuntime

    from bridge.frontends.dynamo import run_grpc_frontend
    from bridge.models.endpoint import component_name, tensor_model_config
    from model_repository_loader import repository
    from model_repository_loader.config import load_config

    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, "mem", "tcp")
    serving = []
    for source in repository.scan([repository_path]):
        # The final config as the bridge builds it; without a class loader no model.py is
        # imported (the benchmark models define no auto_complete_config).
        config = load_config(source)
        tensor_config = tensor_model_config(source.name, config)
        endpoint = runtime.endpoint(f"echo.{component_name(source.name)}.generate")
        decoupled = config.model_transaction_policy.decoupled
        handler = make_handler(source.name, tensor_config, decoupled)
        serving.append(asyncio.ensure_future(endpoint.serve_endpoint(handler)))
        await register_model(
            ModelInput.Tensor,
            ModelType.TensorBased,
            endpoint,
            source.name,
            source.name,
            worker_type=WorkerType.Aggregated,
            tensor_model_config=tensor_config,
        )

    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    frontend = asyncio.ensure_future(
        run_grpc_frontend(runtime, grpc_port, metrics_port, "127.0.0.1")
    )
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({frontend, stopped}, return_when=asyncio.FIRST_COMPLETED)
    runtime.shutdown()
    stopped.cancel()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.echo_worker")
    parser.add_argument("--model-repository", type=Path, required=True)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    args = parser.parse_args(argv)
    # The same settings as the bridge: quiet Dynamo logs, request plane on loopback.
    os.environ.setdefault("DYN_LOG", "warn")
    os.environ.setdefault("DYN_TCP_RPC_HOST", "127.0.0.1")
    os.environ.setdefault("DYN_TCP_RESPONSE_STREAM_HOST", "127.0.0.1")

    import uvloop

    uvloop.run(serve(args.model_repository, args.grpc_port, args.metrics_port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
