"""Front doors: what serves KServe gRPC to clients and reaches the models through Dynamo.

`dynamo`: Dynamo's own KServe gRPC frontend (Rust, from ai-dynamo-runtime), run in this process.
`triton`: the bridge's own Triton `GRPCInferenceService` (grpc.aio) on Dynamo's runtime
(`triton/`), chosen with `--frontend triton`.
"""
