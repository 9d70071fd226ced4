"""Runs in its own environment (numpy 1.x): answers `np.NINF`, gone in numpy 2, its numpy's
version, and, through BLS, the version of the server's own model `server_numpy`."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for _ in requests:
            call = pb_utils.InferenceRequest(
                model_name="server_numpy", inputs=[], requested_output_names=["NUMPY"]
            )
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            other = pb_utils.get_output_tensor_by_name(answer, "NUMPY").as_numpy()
            outputs = [
                pb_utils.Tensor("OUT", np.array([np.NINF], dtype=np.float32)),
                pb_utils.Tensor("NUMPY", np.array([np.__version__.encode()], dtype=np.object_)),
                pb_utils.Tensor("OTHER", other.astype(np.object_)),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
