"""Version 2: VERSION = args["model_version"] as a number, TAG = this file's tag."""

import numpy as np
import triton_python_backend_utils as pb_utils

TAG = b"versioned file v2"


class TritonPythonModel:
    def initialize(self, args):
        self.version = int(args["model_version"])

    def execute(self, requests):
        responses = []
        for _ in requests:
            outputs = [
                pb_utils.Tensor("VERSION", np.array([self.version], dtype=np.int32)),
                pb_utils.Tensor("TAG", np.array([TAG], dtype=np.object_)),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
