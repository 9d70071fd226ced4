"""Request rescheduling (iterative_sequence): each request is released with RESCHEDULE until it
has run `IN` times, then answered with OUT = the number of runs. REPORT lists the instance."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.instance = args["model_instance_name"]
        self.runs = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            key = (request.correlation_id(), request.request_id())
            runs = self.runs.get(key, 0) + 1
            target = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            if runs < target:
                self.runs[key] = runs
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(None)
                continue
            self.runs.pop(key, None)
            report = {
                "corrid": request.correlation_id(),
                "flags": request.flags(),
                "batch": len(requests),
                "instance": self.instance,
                "controls": {},
            }
            out = [
                pb_utils.Tensor("OUT", np.array([runs], dtype=np.int32)),
                pb_utils.Tensor(
                    "REPORT", np.array([json.dumps(report).encode()], dtype=np.object_)
                ),
            ]
            responses.append(pb_utils.InferenceResponse(out))
        return responses
