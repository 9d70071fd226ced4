"""BF16 identity through DLPack: numpy has no bfloat16, so as_numpy() is not an option.

The input tensor itself is handed to from_dlpack (it implements __dlpack__/__dlpack_device__).
"""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            output = pb_utils.Tensor.from_dlpack("OUTPUT0", values)
            responses.append(pb_utils.InferenceResponse([output]))
        return responses
