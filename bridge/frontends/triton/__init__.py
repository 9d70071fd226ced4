"""The bridge's own front door: Triton's `GRPCInferenceService` on Dynamo's runtime.

`server.py` runs the grpc.aio server (address, TLS, message sizes); `servicer.py` answers the
RPCs; `directory.py` knows which models exist and which endpoint serves them, from the bridge
control endpoint of every worker; `tensors.py` converts KServe protobufs ⇄ the bridge tensor
form; `status.py` maps Triton's error codes to gRPC status codes.
"""

from .server import DoorOptions, TritonDoor

__all__ = ["DoorOptions", "TritonDoor"]
