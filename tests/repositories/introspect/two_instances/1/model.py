"""INSTANCE = args["model_instance_name"] of the instance that answered, after SLEEP_MS ms.

Sleeping lets concurrent requests spread over the instances.
"""

import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.instance_name = args["model_instance_name"].encode("utf-8")

    def execute(self, requests):
        responses = []
        for request in requests:
            sleep_ms = int(pb_utils.get_input_tensor_by_name(request, "SLEEP_MS").as_numpy()[0])
            time.sleep(sleep_ms / 1000.0)
            name = np.array([self.instance_name], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("INSTANCE", name)]))
        return responses
