"""Doubles X and says which process and instance answered; BUSY_MS keeps the instance busy."""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.instance = args["model_instance_name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            busy_ms = json.loads(request.parameters()).get("busy_ms", 0)
            if busy_ms:
                # Pure-Python work that holds the GIL, as a tokenizer would.
                end = time.perf_counter() + busy_ms / 1000
                while time.perf_counter() < end:
                    pass
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("Y", x * 2),
                        pb_utils.Tensor("PID", np.array([os.getpid()], np.int64)),
                        pb_utils.Tensor("INSTANCE", np.array([self.instance.encode()], object)),
                    ]
                )
            )
        return responses
