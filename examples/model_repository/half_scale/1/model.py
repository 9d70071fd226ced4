"""half_scale: Y = X * scale, in FP16; `scale` comes from the config's parameters."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        # Parameters look like {"scale": {"string_value": "2.5"}}; the value is always a string.
        self.scale = np.float16(config["parameters"]["scale"]["string_value"])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            y = (x * self.scale).astype(np.float16)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return responses
