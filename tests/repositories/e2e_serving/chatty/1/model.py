"""Logs through pb_utils.Logger in every phase; each message names its phase and level.

Tests find the line of each call by its message text, so keep one call per line. (Triton binds
pb_utils.Logger only once the stub runs, so it is looked up inside the methods, not at import.)
"""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        logger = pb_utils.Logger
        logger.log_info("chatty-initialize-info")
        logger.log_verbose("chatty-initialize-verbose")

    def execute(self, requests):
        logger = pb_utils.Logger
        responses = []
        for request in requests:
            logger.log_info(f"chatty-execute-info id={request.request_id()}")
            logger.log_warn("chatty-execute-warn")
            logger.log_error("chatty-execute-error")
            logger.log_verbose("chatty-execute-verbose")
            logger.log("chatty-execute-log-verbose", logger.VERBOSE)
            values = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", values)]))
        return responses

    def finalize(self):
        pb_utils.Logger.log_info("chatty-finalize-info")
