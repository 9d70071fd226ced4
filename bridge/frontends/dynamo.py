"""Dynamo's KServe gRPC frontend, run in this process on the given runtime."""

from __future__ import annotations

from dynamo._core import EngineType
from dynamo.llm import EntrypointArgs, make_engine, run_input
from dynamo.runtime import DistributedRuntime


async def run_grpc_frontend(
    runtime: DistributedRuntime,
    grpc_port: int,
    metrics_port: int,
    host: str | None = None,
    namespace: str | None = None,
) -> None:
    """Serve KServe gRPC (Triton's protocol) until the runtime shuts down.

    The frontend discovers every TensorBased model registered on `runtime`'s discovery backend
    in `namespace` (None: every namespace), including ones registered later and ones served by
    other processes. Note: Dynamo 1.6 binds gRPC and `metrics_port` on all interfaces whatever
    `host` says, with no setting for either address (bridge/roles/frontend.py,
    docs/frontend_differences.md). `metrics_port` is the frontend's own HTTP port (`/metrics`,
    `/health`, `/live`, `/v1/models`, `/docs`); the bridge serves the public metrics port
    itself and passes only `GET /health` and `/live` through (bridge/metrics/server.py).
    """
    args = EntrypointArgs(
        EngineType.Dynamic,
        http_host=host,
        http_port=grpc_port,
        http_metrics_port=metrics_port,
        namespace=namespace,
    )
    engine = await make_engine(runtime, args)
    await run_input(runtime, "grpc", engine)
