"""Warmup probe: remembers every `execute` call it gets before a request with the parameter
`report` arrives, and answers that request with them as JSON (CALLS).

Per call: the number of requests and, per input, its dtype, shape and values (numeric: whether
all are zero, and the values when `values` is in the input's name; BYTES: the strings).
`fail_warmup` in the model's parameters makes every call before a report raise.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.calls = []
        config = json.loads(args["model_config"])
        self.fail = "fail_warmup" in config.get("parameters", {})

    def execute(self, requests):
        reports = [r for r in requests if "report" in json.loads(r.parameters() or "{}")]
        if not reports:
            if self.fail:
                raise ValueError("this model refuses to warm up")
            self.calls.append({"requests": len(requests), "inputs": _inputs(requests[0])})
            return [pb_utils.InferenceResponse([_calls([])]) for _ in requests]
        return [pb_utils.InferenceResponse([_calls(self.calls)]) for _ in requests]


def _inputs(request):
    seen = {}
    for tensor in request.inputs():
        array = tensor.as_numpy()
        entry = {"dtype": str(array.dtype), "shape": list(array.shape)}
        if array.dtype == np.object_:
            entry["strings"] = [bytes(x).decode() for x in array.flatten()]
        else:
            entry["all_zero"] = bool(not array.any())
            if "values" in tensor.name():
                entry["values"] = array.flatten().tolist()
        seen[tensor.name()] = entry
    return seen


def _calls(calls):
    return pb_utils.Tensor("CALLS", np.array([json.dumps(calls).encode()], dtype=np.object_))
