import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Standardizes RAW: zero mean, unit variance."""

    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "RAW").as_numpy()
            features = (raw - raw.mean()) / (raw.std() + np.float32(1e-6))
            out = pb_utils.Tensor("FEATURES", features.astype(np.float32))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
