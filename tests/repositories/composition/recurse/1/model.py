"""Calls 'recurse' by BLS with DEPTH-1 while DEPTH > 0; TRACE is the chain of models visited.

With one instance this waits on a model whose only instance is busy waiting on it.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

NEXT = "recurse"


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            depth = int(pb_utils.get_input_tensor_by_name(request, "DEPTH").as_numpy()[0])
            trace = "recurse"
            if depth > 0:
                call = pb_utils.InferenceRequest(
                    model_name=NEXT,
                    inputs=[pb_utils.Tensor("DEPTH", np.array([depth - 1], dtype=np.int32))],
                    requested_output_names=["TRACE"],
                )
                reply = call.exec()
                if reply.has_error():
                    responses.append(pb_utils.InferenceResponse(error=reply.error()))
                    continue
                inner = pb_utils.get_output_tensor_by_name(reply, "TRACE").as_numpy()[0]
                trace += ">" + inner.decode()
            out = pb_utils.Tensor("TRACE", np.array([trace.encode()], dtype=object))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
