"""BF16 identity through an explicit DLPack capsule (to_dlpack), then from_dlpack."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            capsule = pb_utils.get_input_tensor_by_name(request, "INPUT0").to_dlpack()
            output = pb_utils.Tensor.from_dlpack("OUTPUT0", capsule)
            responses.append(pb_utils.InferenceResponse([output]))
        return responses
