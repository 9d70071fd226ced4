"""COUNT = the element count of INPUT0, once the input is what Triton's stub hands a model.

Request parameters (strings, file paths the test chooses): `started` is written as soon as
execute begins; then execute waits until `gate` exists (at most 60 s, then it raises).
"""

import json
import os
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

GATE_TIMEOUT_S = 60.0


def wait_for(path):
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {path} never opened")
        time.sleep(0.01)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            if "started" in params:
                Path(f"{params['started']}.tmp").write_text("started")
                os.replace(f"{params['started']}.tmp", params["started"])
            if "gate" in params:
                wait_for(params["gate"])
            values = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if values.dtype != np.object_ or values.ndim != 1:
                raise TypeError(f"expected a 1-D object array, got {values.dtype} {values.shape}")
            if not all(type(item) is bytes for item in values):
                raise TypeError("an element is not bytes")
            count = np.array([values.size], dtype=np.int64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("COUNT", count)]))
        return responses
