"""Decoupled, with response parameters (Triton 25.02+; raises TypeError on 2.51).

One response per element of IN with parameters {"index": i, "last": <bool>, "tag": "t<i>"},
FINAL sent with the last one.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().tolist()
            sender = request.get_response_sender()
            for index, value in enumerate(values):
                last = index == len(values) - 1
                out = pb_utils.Tensor("OUT", np.array([value], dtype=np.int32))
                parameters = {"index": index, "last": last, "tag": f"t{index}"}
                flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0
                sender.send(pb_utils.InferenceResponse([out], parameters=parameters), flags)
        return None
