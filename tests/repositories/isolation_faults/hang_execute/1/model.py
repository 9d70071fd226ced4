"""execute writes `started`, then waits until `gate` exists or the request is cancelled."""

import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.folder = args["model_repository"]

    def execute(self, requests):
        with open(os.path.join(self.folder, "started"), "w") as f:
            f.write(str(os.getpid()))
        gate = os.path.join(self.folder, "gate")
        while not os.path.exists(gate) and not any(r.is_cancelled() for r in requests):
            time.sleep(0.02)
        responses = []
        for request in requests:
            if request.is_cancelled():
                error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                x = pb_utils.get_input_tensor_by_name(request, "X")
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x.as_numpy())]))
        return responses
