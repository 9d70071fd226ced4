"""Iterative decoupled model: each execution sends one response and reschedules the request.

For IN = n it answers OUT = n-1, n-2, ..., 0, one per execution of the same request, asking
for another execution with `set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)` until
it sent 0, and then sends FINAL. Progress is kept per request id (send a unique one).
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.left = {}

    def execute(self, requests):
        for request in requests:
            key = request.request_id()
            if key not in self.left:
                self.left[key] = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            self.left[key] -= 1
            sender = request.get_response_sender()
            out = pb_utils.Tensor("OUT", np.array([self.left[key]], dtype=np.int32))
            if self.left[key] > 0:
                sender.send(pb_utils.InferenceResponse([out]))
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            else:
                del self.left[key]
                final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                sender.send(pb_utils.InferenceResponse([out]), final)
        return None
