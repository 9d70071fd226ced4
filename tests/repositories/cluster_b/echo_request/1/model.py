import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            info = {
                "request_id": request.request_id(),
                "correlation_id": request.correlation_id(),
                "flags": request.flags(),
                "timeout": request.timeout(),
                "parameters": json.loads(request.parameters()),
                "requested_output_names": sorted(request.requested_output_names()),
                "inputs": sorted(t.name() for t in request.inputs()),
            }
            out = pb_utils.Tensor(
                "INFO", np.array([json.dumps(info, sort_keys=True).encode()], dtype=object)
            )
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
