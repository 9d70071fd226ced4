"""A Dynamo TensorBased worker that is not a bridge worker, for the triton door's tests.

It serves every model of a repository with the benchmarks' echo handlers (benchmarks/
echo_worker.py: Dynamo's standard form in and out, no bridge form, no control endpoint) and
registers each with `register_model(ModelInput.Tensor, ModelType.TensorBased, ...)`, the Triton
config included, as any Dynamo worker for Dynamo's KServe frontend does. Discovery and request
plane come from DYN_DISCOVERY_BACKEND (default file) and DYN_REQUEST_PLANE (default tcp).
Prints `registered` once every model is registered; runs until SIGTERM.

    python -m tests.e2e.foreign_worker --model-repository benchmarks/repository \
        --namespace dynamo_bridge
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from pathlib import Path


async def serve(repository_path: Path, namespace: str) -> None:
    from dynamo.llm import ModelInput, ModelType, WorkerType, register_model
    from dynamo.runtime import DistributedRuntime

    from benchmarks.echo_worker import make_handler
    from bridge.models.endpoint import tensor_model_config
    from model_repository_loader import repository
    from model_repository_loader.config import load_config

    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(
        loop,
        os.environ.get("DYN_DISCOVERY_BACKEND", "file"),
        os.environ.get("DYN_REQUEST_PLANE", "tcp"),
    )
    serving = []
    for source in repository.scan([repository_path]):
        config = load_config(source)
        tensor_config = tensor_model_config(source.name, config)
        component = "foreign-" + source.name.replace("_", "-")
        endpoint = runtime.endpoint(f"{namespace}.{component}.generate")
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
    print("registered", flush=True)
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    runtime.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.foreign_worker")
    parser.add_argument("--model-repository", type=Path, required=True)
    parser.add_argument("--namespace", default="dynamo_bridge")
    args = parser.parse_args()
    os.environ.setdefault("DYN_LOG", "warn")
    os.environ.setdefault("DYN_TCP_RPC_HOST", "127.0.0.1")
    os.environ.setdefault("DYN_TCP_RESPONSE_STREAM_HOST", "127.0.0.1")
    asyncio.run(serve(args.model_repository, args.namespace))


if __name__ == "__main__":
    main()
