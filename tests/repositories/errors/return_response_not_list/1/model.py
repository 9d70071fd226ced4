"""Returns a bare InferenceResponse instead of a list of them."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        value = pb_utils.get_input_tensor_by_name(requests[0], "INPUT0").as_numpy()
        return pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value)])
