"""MATRIX_OUT = MATRIX * SCALAR, as the model sees them; SHAPES = JSON of the shapes it saw.

The model receives MATRIX as [batch, 4] and SCALAR as [batch] and returns MATRIX_OUT as
[batch, 4] and SCALAR_OUT as [batch]; the server reshapes to the config's dims.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            matrix = pb_utils.get_input_tensor_by_name(request, "MATRIX").as_numpy()
            scalar = pb_utils.get_input_tensor_by_name(request, "SCALAR").as_numpy()
            seen = json.dumps({"MATRIX": list(matrix.shape), "SCALAR": list(scalar.shape)})
            rows = matrix.shape[0]
            outputs = [
                pb_utils.Tensor("MATRIX_OUT", matrix * scalar.reshape(rows, 1)),
                pb_utils.Tensor("SCALAR_OUT", scalar * 2),
                pb_utils.Tensor("SHAPES", np.array([[seen.encode()]] * rows, dtype=np.object_)),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
