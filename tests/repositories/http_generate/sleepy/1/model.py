"""Answers after N seconds (at most), or as soon as its request is cancelled; with the request
parameter `report` (a file path) it writes there, as JSON, whether it saw the cancellation."""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            seconds = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and not request.is_cancelled():
                time.sleep(0.02)
            report = json.loads(request.parameters()).get("report")
            if report:
                with open(report + ".tmp", "w") as f:
                    json.dump({"cancelled": request.is_cancelled()}, f)
                os.replace(report + ".tmp", report)
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("V", np.array([seconds], np.int32))])
            )
        return responses
