"""The floor: bare Dynamo with the smallest Python handler that answers the benchmark models.

One process, like the bridge's embedded default: `DistributedRuntime("mem", "tcp")`, one
TensorBased endpoint per model of the repository, registered with the same
`tensor_model_config` (Triton config included) the bridge registers, and Dynamo's KServe gRPC
frontend in-process. The handler does what any Python handler must: lists → numpy → lists
(spec dynamo_runtime §6, "_np"), with the model's arithmetic done inline. No loader, no
validation, no threads. Whatever the bridge costs beyond this process is the bridge's own.

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

_NUMPY = {
    "Bool": np.bool_,
    "Uint8": np.uint8,
    "Uint16": np.uint16,
    "Uint32": np.uint32,
    "Uint64": np.uint64,
    "Int8": np.int8,
    "Int16": np.int16,
    "Int32": np.int32,
    "Int64": np.int64,
    "Float32": np.float32,
    "Float64": np.float64,
}

Compute = Callable[[list[np.ndarray]], list[np.ndarray]]


def to_numpy(tensor: dict[str, Any]) -> np.ndarray:
    """A Dynamo tensor dict → numpy, by the fastest conversion for its datatype."""
    metadata = tensor["metadata"]
    values = tensor["data"]["values"]
    data_type = metadata["data_type"]
    if data_type == "Bytes":
        array = np.empty(len(values), dtype=np.object_)
        array[:] = [bytes(bytearray(v)) for v in values]
    else:
        array = np.fromiter(values, _NUMPY[data_type], count=len(values))
    return array.reshape(metadata["shape"])


def to_tensor(name: str, data_type: str, array: np.ndarray) -> dict[str, Any]:
    """numpy → a Dynamo tensor dict (`tolist()`: Dynamo takes Python builtins only)."""
    return {
        "metadata": {"name": name, "data_type": data_type, "shape": list(array.shape)},
        "data": {"data_type": data_type, "values": array.ravel().tolist()},
    }


def _identity(arrays: list[np.ndarray]) -> list[np.ndarray]:
    return arrays


def _add_sub(arrays: list[np.ndarray]) -> list[np.ndarray]:
    a, b = arrays
    return [a + b, a - b]


# What each benchmark model computes; models not named here echo their inputs.
COMPUTE: dict[str, Compute] = {"add_sub": _add_sub}


def make_handler(
    model_name: str, tensor_config: dict[str, Any], decoupled: bool = False
) -> Callable[..., AsyncIterator]:
    """The endpoint handler for one model: outputs are named and typed from its config."""
    outputs = [(o["name"], o["data_type"]) for o in tensor_config["outputs"]]
    compute = COMPUTE.get(model_name, _identity)

    async def generate(request: dict[str, Any], context: Any) -> AsyncIterator[dict[str, Any]]:
        arrays = compute([to_numpy(t) for t in request["tensors"]])
        yield {
            "model": model_name,
            "tensors": [
                to_tensor(name, data_type, array)
                for (name, data_type), array in zip(outputs, arrays, strict=True)
            ],
        }

    async def stream(request: dict[str, Any], context: Any) -> AsyncIterator[dict[str, Any]]:
        # The decoupled benchmark model (stream_100): COUNT responses, OUT = 0..COUNT-1.
        (name, data_type), count = outputs[0], int(to_numpy(request["tensors"][0])[0])
        for i in range(count):
            yield {"model": model_name, "tensors": [to_tensor(name, data_type, np.array([i]))]}

    return stream if decoupled else generate


async def serve(repository_path: Path, grpc_port: int, metrics_port: int) -> None:
    # Imported here: Dynamo reads DYN_LOG when it is first imported (set in main()).
    from dynamo.llm import ModelInput, ModelType, WorkerType, register_model
    from dynamo.runtime import DistributedRuntime

    from bridge.frontends.dynamo import run_grpc_frontend
    from bridge.worker import component_name, tensor_model_config
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
