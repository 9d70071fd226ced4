"""Logs through pb_utils.Logger in every phase; each message names its phase and level.

Tests find the line of each call by its message text, so keep one call per line.
"""

import triton_python_backend_utils as pb_utils

Logger = pb_utils.Logger


class TritonPythonModel:
    def initialize(self, args):
        Logger.log_info("chatty-initialize-info")
        Logger.log_verbose("chatty-initialize-verbose")

    def execute(self, requests):
        responses = []
        for request in requests:
            Logger.log_info(f"chatty-execute-info id={request.request_id()}")
            Logger.log_warn("chatty-execute-warn")
            Logger.log_error("chatty-execute-error")
            Logger.log_verbose("chatty-execute-verbose")
            Logger.log("chatty-execute-log-verbose", Logger.VERBOSE)
            values = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", values)]))
        return responses

    def finalize(self):
        Logger.log_info("chatty-finalize-info")
