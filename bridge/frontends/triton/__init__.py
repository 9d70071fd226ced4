"""The bridge's own front door (`--frontend triton`): Triton's protocols on Dynamo's runtime.

What is answered is decided once, whatever the wire: `service.py` (health, metadata, config,
statistics, repository, where an inference request goes), `directory.py` (which models exist
and which Dynamo endpoint serves each, from the bridge control endpoint of every worker),
`shm.py` (system shared memory regions), `status.py` (the error with Triton's code and text).
Each wire is a subpackage: `grpc/` (Triton's `GRPCInferenceService`) and `http/` (Triton's
HTTP/REST API). `role.py` runs the door as the process's frontend role.
"""

from .grpc.server import DoorOptions
from .http.server import HttpOptions

__all__ = ["DoorOptions", "HttpOptions"]
