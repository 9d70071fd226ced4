"""initialize fails while `fail_init` exists beside the model; execute answers the PID."""

import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        if os.path.exists(os.path.join(args["model_repository"], "fail_init")):
            raise RuntimeError("flaky_init: fail_init is present")

    def execute(self, requests):
        pid = np.array([os.getpid()], np.int64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", pid)]) for _ in requests]
