"""Reports what the sequence batcher handed execute, request by request.

Each response: OUT = the running sum of IN over the request's sequence, kept in this instance
(so a sequence split across instances, or reordered, gives a wrong sum), and REPORT, a JSON
document {"corrid": request.correlation_id(), "flags": request.flags(), "controls": {name:
values of every input but IN}, "batch": len(requests), "instance"}. The request parameter
`sleep_ms` makes execute take that long.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.instance = args["model_instance_name"]
        self.batching = json.loads(args["model_config"])["max_batch_size"] > 0
        self.sums = {}

    def execute(self, requests):
        sleep_ms = max(json.loads(r.parameters()).get("sleep_ms", 0) for r in requests)
        time.sleep(sleep_ms / 1000)
        responses = []
        for request in requests:
            corrid = request.correlation_id()
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            # A START begins the sum again, so a reused correlation id starts clean.
            start = request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
            total = (0 if start else self.sums.get(corrid, 0)) + int(value.sum())
            self.sums[corrid] = total
            controls = {}
            for tensor in request.inputs():
                if tensor.name() != "IN":
                    array = tensor.as_numpy()
                    controls[tensor.name()] = [
                        list(array.shape),
                        str(array.dtype),
                        array.ravel().tolist(),
                    ]
            report = {
                "corrid": corrid,
                "flags": request.flags(),
                "controls": controls,
                "batch": len(requests),
                "instance": self.instance,
            }
            shape = (1, 1) if self.batching else (1,)
            out = [
                pb_utils.Tensor("OUT", np.full(shape, total, dtype=np.int32)),
                pb_utils.Tensor(
                    "REPORT", np.full(shape, json.dumps(report).encode(), dtype=np.object_)
                ),
            ]
            responses.append(pb_utils.InferenceResponse(out))
        return responses
