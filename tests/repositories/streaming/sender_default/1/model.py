"""Default (non-decoupled) mode answering through the response sender and returning [None].

Request parameter `flags`: "final" sends the response with FINAL (default); "split" sends the
response, then a flag-only FINAL.
"""

import json

import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            split = json.loads(request.parameters()).get("flags", "final") == "split"
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", values + 1)])
            sender = request.get_response_sender()
            if split:
                sender.send(response)
                sender.send(flags=FINAL)
            else:
                sender.send(response, FINAL)
        return [None] * len(requests)
