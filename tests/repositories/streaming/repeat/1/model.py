"""One response per element of IN, then a flag-only FINAL (or FINAL with the last one).

Request parameters: `delay_ms` (pause before each response), `final` ("flag": flag-only FINAL,
the default; "last": FINAL sent together with the last response), `thread` (true: send from a
new thread after execute returned), `error_at` (index that gets a TritonError response instead,
without ending the request).
"""

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            params = json.loads(request.parameters())
            if params.get("thread"):
                threading.Thread(target=self._respond, args=(request, params)).start()
            else:
                self._respond(request, params)
        return None

    def _respond(self, request, params):
        values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        sender = request.get_response_sender()
        delay = params.get("delay_ms", 0) / 1000.0
        final_with_last = params.get("final", "flag") == "last"
        error_at = params.get("error_at", -1)
        for index, value in enumerate(values.tolist()):
            if delay:
                time.sleep(delay)
            if index == error_at:
                response = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"no answer for index {index}")
                )
            else:
                response = pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                        pb_utils.Tensor("IDX", np.array([index], dtype=np.uint32)),
                    ]
                )
            last = index == len(values) - 1
            flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last and final_with_last else 0
            sender.send(response, flags)
        if not (final_with_last and len(values)):
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
