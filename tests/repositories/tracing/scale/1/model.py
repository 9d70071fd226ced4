import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """SCALED = 2 * IN, ONES = ones like IN."""

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            outputs = [
                pb_utils.Tensor("SCALED", x * np.float32(2)),
                pb_utils.Tensor("ONES", np.ones_like(x)),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
