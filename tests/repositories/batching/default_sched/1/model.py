"""Reports how the scheduler grouped requests: one JSON line per execute call.

Every response carries OUT = IN and REPORT (one BYTES element per row) holding
{"ids": request ids of this execute call, "sizes": their batch sizes, "call": the instance's
execute counter, "instance", "kind", "device"}. The request parameter `sleep_ms` (the largest in
the call) makes execute take that long, to hold the instance busy. `started` and `gate` (file
paths) hold it without a clock: execute writes `started` and goes on once `gate` exists.
"""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = args
        self.batching = json.loads(args["model_config"])["max_batch_size"] > 0
        self.calls = 0

    def execute(self, requests):
        self.calls += 1
        values = [pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() for r in requests]
        params = [json.loads(r.parameters()) for r in requests]
        sleep_ms = max(p.get("sleep_ms", 0) for p in params)
        time.sleep(sleep_ms / 1000)
        for p in params:
            if p.get("started"):
                open(p["started"], "w").close()
        for gate in [p["gate"] for p in params if p.get("gate")]:
            for _ in range(6000):  # 60 s at most: a test that never opens it fails, not hangs
                if os.path.exists(gate):
                    break
                time.sleep(0.01)
        report = {
            "ids": [r.request_id() for r in requests],
            "sizes": [int(v.shape[0]) if self.batching else 1 for v in values],
            "call": self.calls,
            "instance": self.args["model_instance_name"],
            "kind": self.args["model_instance_kind"],
            "device": self.args["model_instance_device_id"],
        }
        text = json.dumps(report).encode()
        responses = []
        for value in values:
            rows = value.shape[0] if self.batching else 1
            shape = (rows, 1) if self.batching else (1,)
            out = [
                pb_utils.Tensor("OUT", value),
                pb_utils.Tensor("REPORT", np.full(shape, text, dtype=np.object_)),
            ]
            responses.append(pb_utils.InferenceResponse(out))
        return responses
