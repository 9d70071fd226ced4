"""OUTPUT0 = INPUT0, once the file named by parameter `gate` exists (waited for with no bound)."""

import json
import os
import time
from pathlib import Path

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            if "started" in params:
                Path(params["started"]).write_text("started")
            while "gate" in params and not os.path.exists(params["gate"]):
                time.sleep(0.01)  # stuck for good unless the test opens the gate
            values = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", values)]))
        return responses
