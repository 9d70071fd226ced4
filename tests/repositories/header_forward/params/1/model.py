"""PARAMETERS = the request's `parameters()` as JSON with sorted keys (the forwarded headers)."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = json.dumps(json.loads(request.parameters()), sort_keys=True)
            tensor = pb_utils.Tensor("PARAMETERS", np.array([text.encode()], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse([tensor]))
        return responses
