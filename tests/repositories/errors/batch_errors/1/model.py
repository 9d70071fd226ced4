"""Per-request errors inside a dynamic batch.

For each request: any negative value raises RuntimeError (so every request of that execute
call fails); else any odd value gives TritonError(INVALID_ARG) for that request only; else
OUTPUT0 echoes INPUT0. EXEC_SIZE is len(requests) of the execute call that answered.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        values = [
            pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy() for request in requests
        ]
        if any((v < 0).any() for v in values):
            raise RuntimeError("batch_errors got a negative value")
        responses = []
        for value in values:
            if (value % 2 == 1).any():
                error = pb_utils.TritonError(
                    f"odd value(s) {value.ravel().tolist()}", pb_utils.TritonError.INVALID_ARG
                )
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            exec_size = np.full((value.shape[0], 1), len(requests), dtype=np.int32)
            outputs = [
                pb_utils.Tensor("OUTPUT0", value),
                pb_utils.Tensor("EXEC_SIZE", exec_size),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
