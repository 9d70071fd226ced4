import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = INPUT0, 100 ms per request (slower than the producer)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", tensor.as_numpy())])
            )
            time.sleep(0.1)
        return responses
