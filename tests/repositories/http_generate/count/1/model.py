"""Decoupled: N responses (I = 0..N-1, WORD = "w<i>"), then a flag-only FINAL."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            for i in range(n):
                sender.send(
                    pb_utils.InferenceResponse(
                        [
                            pb_utils.Tensor("I", np.array([i], np.int32)),
                            pb_utils.Tensor("WORD", np.array([f"w{i}".encode()], np.object_)),
                        ]
                    )
                )
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
