"""The bridge's own front door (`--frontend triton`): Triton's protocols on Dynamo's runtime.

What is answered is decided once, whatever the wire:
- `service.py`: health, metadata, config, statistics, repository, and where an inference
  request goes (the answers both wires give);
- `directory.py`: which models exist and which Dynamo endpoint serves each, from the bridge
  control endpoint of every worker, plus `model_cards.py` for TensorBased workers that are not
  bridge workers (Dynamo's own model cards);
- `routes.py`: how a request reaches its endpoint (in-process to this process's own worker,
  the request plane in the bridge form, or Dynamo's standard form via `foreign.py`);
- `tensor_checks.py` and `classification.py`: the input checks and top-k outputs both wires
  share; `shm.py`: system shared memory regions; `log_trace_settings.py`: log and trace settings;
  `door_error.py`: the error with Triton's code and text.
Each wire is a subpackage: `grpc/` (Triton's `GRPCInferenceService`) and `http/` (Triton's
HTTP/REST API). bridge/roles/triton_door.py runs the door as the process's frontend role.
"""

from .grpc.server import DoorOptions
from .http.server import HttpOptions

__all__ = ["DoorOptions", "HttpOptions"]
