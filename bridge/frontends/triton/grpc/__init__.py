"""The triton door's gRPC wire: Triton's `GRPCInferenceService` over the door's service."""
