"""The server's own environment: answers its numpy's version."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        version = np.array([np.__version__.encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("NUMPY", version)]) for _ in requests]
