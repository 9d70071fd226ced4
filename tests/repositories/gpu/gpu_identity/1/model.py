"""Answers its input as it is, and whether it reached execute on the GPU."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "IN")
            on_gpu = np.array([not tensor.is_cpu()], dtype=bool)
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor.from_dlpack("OUT", tensor.to_dlpack()),
                        pb_utils.Tensor("ON_GPU", on_gpu),
                    ]
                )
            )
        return responses
