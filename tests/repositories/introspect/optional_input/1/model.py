"""OUTPUT0 = REQUIRED + OPT_A + OPT_B (absent ones count as 0); PRESENT = JSON of input names."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            required = pb_utils.get_input_tensor_by_name(request, "REQUIRED")
            if required is None:
                # Triton 2.51 does not enforce required inputs on a model that has optional
                # ones; say so from the model, so a client can tell who refused the request.
                error = pb_utils.TritonError(
                    "optional_input: REQUIRED is missing", pb_utils.TritonError.INVALID_ARG
                )
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            total = required.as_numpy().copy()
            for name in ("OPT_A", "OPT_B"):
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:  # an omitted optional input is simply not there
                    total += tensor.as_numpy()
            present = json.dumps(sorted(tensor.name() for tensor in request.inputs()))
            outputs = [
                pb_utils.Tensor("OUTPUT0", total),
                pb_utils.Tensor("PRESENT", np.array([present.encode("utf-8")], dtype=np.object_)),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
