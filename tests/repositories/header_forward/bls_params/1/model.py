"""Calls `params` through BLS twice: once with no parameters, once passing its own on.

OWN = its own `parameters()`; CALLEE_PLAIN / CALLEE_PASSED = what `params` saw each time. Shows
whether forwarded headers reach a BLS callee by themselves (they do not in Triton).
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


def _text(value):
    return pb_utils.Tensor(value[0], np.array([value[1].encode()], dtype=np.object_))


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            own = json.loads(request.parameters())
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            seen = []
            for parameters in ({}, own):
                call = pb_utils.InferenceRequest(
                    model_name="params",
                    inputs=[tensor],
                    requested_output_names=["PARAMETERS"],
                    parameters=parameters,
                )
                answer = call.exec()
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                out = pb_utils.get_output_tensor_by_name(answer, "PARAMETERS").as_numpy()
                seen.append(out[0].decode() if isinstance(out[0], bytes) else str(out[0]))
            outputs = [
                _text(("OWN", json.dumps(own, sort_keys=True))),
                _text(("CALLEE_PLAIN", seen[0])),
                _text(("CALLEE_PASSED", seen[1])),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
