import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Echoes INPUT0 after sleeping the request parameter `sleep_ms` (default 300)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            time.sleep(json.loads(request.parameters()).get("sleep_ms", 300) / 1000)
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
