"""greeter: GREETING = "Hello, [TITLE ]NAME<punctuation>"; REQUEST_ID echoes the request id.

Request parameters (sent by the client next to the inputs) change the greeting:
  punctuation (string, default "!") is appended;
  shout (bool, default false) upper-cases the whole greeting.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


def _text(request, name):
    """Return the first string of input `name`, or None when the client did not send it."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    return tensor.as_numpy().flat[0].decode("utf-8")


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            # parameters() is a JSON object string, "{}" when the client sent none.
            params = json.loads(request.parameters())
            punctuation = str(params.get("punctuation", "!"))

            name = _text(request, "NAME")
            title = _text(request, "TITLE")
            who = f"{title} {name}" if title else name
            greeting = f"Hello, {who}{punctuation}"
            if params.get("shout") is True:
                greeting = greeting.upper()

            outputs = [
                pb_utils.Tensor("GREETING", np.array([greeting.encode("utf-8")], dtype=np.object_)),
                # request_id() is "" when the client did not set an id.
                pb_utils.Tensor(
                    "REQUEST_ID", np.array([request.request_id().encode("utf-8")], dtype=np.object_)
                ),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
