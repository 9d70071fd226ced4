"""A BYTES output built from Python objects that are not bytes: str, int, float and bytes mixed
in one object array, as models often build them (Triton serializes each with str().encode())."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            n = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            items = [f"héllo {int(v)}" if v % 3 == 0 else int(v) if v % 3 == 1 else b"raw"
                     for v in n]
            out = np.array(items + [2.5], dtype=object)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out)]))
        return responses
