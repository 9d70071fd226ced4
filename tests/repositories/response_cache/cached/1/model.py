"""OUTPUT0 = INPUT0 * 2; EXECUTIONS = how many requests this instance has executed so far.

A cached answer repeats the EXECUTIONS of the request that filled the cache, so a client sees
whether `execute` ran for its request.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.executed = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            self.executed += 1
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            outputs = [
                pb_utils.Tensor("OUTPUT0", (data * 2).astype(np.float32)),
                pb_utils.Tensor("EXECUTIONS", np.array([self.executed], dtype=np.int64)),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
