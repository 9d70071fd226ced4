"""OUTPUT0 = 2 * INPUT0 + 1; TEXT = each value as `{:g}`; PARAMS = request.parameters();
PID = the id of the process that ran execute, so a test can tell which worker answered.

Request parameter `delay_ms` (int): sleep that long before answering, to keep requests in
flight on a worker.
"""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = request.parameters()
            delay_ms = json.loads(params).get("delay_ms", 0)
            if delay_ms:
                time.sleep(delay_ms / 1000)
            values = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            text = np.array([f"{v:g}".encode() for v in values.reshape(-1)], dtype=object)
            outputs = [
                pb_utils.Tensor("OUTPUT0", (2 * values + 1).astype(np.float32)),
                pb_utils.Tensor("TEXT", text.reshape(values.shape)),
                pb_utils.Tensor("PARAMS", np.array([params.encode()], dtype=object)),
                pb_utils.Tensor("PID", np.array([os.getpid()], np.int64)),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
