import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        self.answer = float(parameters["ANSWER"]["string_value"])

    def execute(self, requests):
        out = np.array([self.answer], dtype=np.float32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]) for _ in requests]
