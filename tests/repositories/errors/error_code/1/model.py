"""Answers with TritonError(f"error code: {NAME}", TritonError.NAME) or echoes INPUT0.

NAME is taken from the optional BYTES input CODE if sent, else from the request parameter
"code". NAME "DEFAULT" builds TritonError without a code argument (which means INTERNAL).
Without either, the request succeeds and OUTPUT0 echoes INPUT0.
"""

import json

import triton_python_backend_utils as pb_utils

CODE_NAMES = (
    "UNKNOWN",
    "INTERNAL",
    "NOT_FOUND",
    "INVALID_ARG",
    "UNAVAILABLE",
    "UNSUPPORTED",
    "ALREADY_EXISTS",
    "CANCELLED",
)


def requested_code(request):
    tensor = pb_utils.get_input_tensor_by_name(request, "CODE")
    if tensor is not None:
        return tensor.as_numpy().flat[0].decode("utf-8")
    return json.loads(request.parameters()).get("code")


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            name = requested_code(request)
            if name is None:
                value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                response = pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value)])
            elif name == "DEFAULT":
                response = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("error code: DEFAULT")
                )
            elif name in CODE_NAMES:
                error = pb_utils.TritonError(
                    f"error code: {name}", getattr(pb_utils.TritonError, name)
                )
                response = pb_utils.InferenceResponse(error=error)
            else:
                error = pb_utils.TritonError(
                    f"unknown error code name '{name}'", pb_utils.TritonError.INVALID_ARG
                )
                response = pb_utils.InferenceResponse(error=error)
            responses.append(response)
        return responses
