import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """IN = n: n responses OUT = [[0.5]], 20 ms apart, then a flag-only FINAL."""

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            count = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().item())
            out = pb_utils.Tensor("OUT", np.array([[0.5]], dtype=np.float32))
            for _ in range(count):
                time.sleep(0.02)
                sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
