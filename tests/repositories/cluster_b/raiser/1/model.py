import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = request.parameters()
            if "not_found" in params:
                # An error with a code of its own: BLS callers see which code survives.
                error = pb_utils.TritonError(
                    "raiser says not found", pb_utils.TritonError.NOT_FOUND
                )
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                raise ValueError("raiser refuses")
        return responses
