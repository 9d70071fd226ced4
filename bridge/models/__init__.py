"""The serving models: their lifecycle, and the model loading API models call.

- `manager.py`: `ModelManager` loads, swaps (zero-gap hot reload) and unloads models, each
  served as a Dynamo endpoint (`endpoint.py`).
- `endpoint.py`: `ModelWorker`, one model's Dynamo endpoint: it answers the model's requests
  and owns its retirement (unregister, withdraw once quiet, let go).
- `loading_api.py`: `ModelControl`, what `pb_utils.load_model` / `unload_model` /
  `is_model_ready` reach (a repository's `ModelServices.control`).
- `threads.py`: model code (`initialize`, `finalize`) on daemon threads of its own.
- `errors.py`: a refused or failed load/unload, with Triton's texts.
"""

from .errors import NOT_EXPLICIT, SERVER_NOT_READY, ControlError, poll_failed
from .loading_api import ModelControl
from .manager import MODEL_CONTROL_MODES, ModelManager, digests_of

__all__ = [
    "MODEL_CONTROL_MODES",
    "NOT_EXPLICIT",
    "SERVER_NOT_READY",
    "ControlError",
    "ModelControl",
    "ModelManager",
    "digests_of",
    "poll_failed",
]
