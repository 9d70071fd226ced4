import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sends IN responses OUT=[0], [1], ... then a flag-only final; IN < 0 sends an error.

    Stops early when cancelled, waiting DELAY_MS (request parameter) between responses.
    """

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            count = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            delay = __import__("json").loads(request.parameters()).get("delay_ms", 0) / 1000
            if count < 0:
                error = pb_utils.TritonError("repeat_dec got a negative count")
                sender.send(pb_utils.InferenceResponse(error=error))
            for i in range(max(count, 0)):
                if request.is_cancelled():
                    break
                out = pb_utils.Tensor("OUT", np.array([i], dtype=np.int32))
                sender.send(pb_utils.InferenceResponse([out]))
                time.sleep(delay)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
