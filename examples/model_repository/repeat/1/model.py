"""repeat: COUNT responses; response i has VALUE = VALUES[i % len(VALUES)] and INDEX = i.

The FINAL flag travels with the last response, so a client sees the end of the stream without
asking for an empty final response. COUNT = 0 sends only a flag-only FINAL (nothing reaches the
client unless it set `enable_empty_final_response=True`).
"""

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "VALUES").as_numpy()
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            sender = request.get_response_sender()
            if count <= 0 or values.size == 0:
                sender.send(flags=FINAL)
                continue
            for index in range(count):
                outputs = [
                    pb_utils.Tensor("VALUE", np.array([values[index % values.size]], np.int32)),
                    pb_utils.Tensor("INDEX", np.array([index], dtype=np.uint32)),
                ]
                flags = FINAL if index == count - 1 else 0
                sender.send(pb_utils.InferenceResponse(outputs), flags)
        return None
