"""Works STEPS steps of 20 ms; stops with CANCELLED as soon as the request is cancelled."""

import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            steps = int(pb_utils.get_input_tensor_by_name(request, "STEPS").as_numpy()[0])
            done = 0
            while done < steps and not request.is_cancelled():
                time.sleep(0.02)
                done += 1
            if request.is_cancelled():
                error = pb_utils.TritonError(
                    f"cancelled after {done} steps", pb_utils.TritonError.CANCELLED
                )
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                out = pb_utils.Tensor("DONE", np.array([done], np.int32))
                responses.append(pb_utils.InferenceResponse([out]))
        return responses
