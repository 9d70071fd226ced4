"""text_case: UPPER = TEXT.upper() for every UTF-8 string of the input."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            # BYTES inputs arrive as a numpy object array whose elements are `bytes`.
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper = np.array(
                [item.decode("utf-8").upper().encode("utf-8") for item in text.flat],
                dtype=np.object_,
            ).reshape(text.shape)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("UPPER", upper)]))
        return responses
