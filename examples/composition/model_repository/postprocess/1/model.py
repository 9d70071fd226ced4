import numpy as np
import triton_python_backend_utils as pb_utils

LABELS = [b"cat", b"dog", b"bird"]


class TritonPythonModel:
    """Softmax over LOGITS, and the name of the most likely class."""

    def execute(self, requests):
        responses = []
        for request in requests:
            logits = pb_utils.get_input_tensor_by_name(request, "LOGITS").as_numpy()
            exp = np.exp(logits - logits.max())
            probs = (exp / exp.sum()).astype(np.float32)
            label = np.array([LABELS[int(probs.argmax())]], dtype=object)
            outputs = [pb_utils.Tensor("PROBS", probs), pb_utils.Tensor("LABEL", label)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
