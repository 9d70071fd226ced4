"""initialize writes its PID to `initializing`, then waits until `gate` exists."""

import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        folder = args["model_repository"]
        with open(os.path.join(folder, "initializing"), "w") as f:
            f.write(str(os.getpid()))
        while not os.path.exists(os.path.join(folder, "gate")):
            time.sleep(0.05)

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "X")])
            for r in requests
        ]
