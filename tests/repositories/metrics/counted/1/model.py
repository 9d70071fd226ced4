"""OUT = IN, counting requests in custom metrics.

IN = -1 in a request: that request gets an error response (a TritonError); IN = -2: execute
raises, failing every request of the call. Request parameters `started` and `gate` (file paths):
execute writes `started`, then returns only once `gate` exists (holds the instance busy).

Families, named after the model so that two models never share one: `<model>_requests`
(counter, label `kind="ok"|"failed"`), `<model>_last_batch` (gauge: rows of the last execute
call) and `<model>_rows` (histogram of each request's rows, buckets 1, 2, 4). No `finalize`: the
families must go away with the model all the same, as under Triton.
"""

import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        name = args["model_name"]
        self.requests = pb_utils.MetricFamily(
            f"{name}_requests", "requests seen by the model", pb_utils.MetricFamily.COUNTER
        )
        self.ok = self.requests.Metric(labels={"kind": "ok"})
        self.failed = self.requests.Metric(labels={"kind": "failed"})
        self.batch = pb_utils.MetricFamily(
            f"{name}_last_batch", "rows of the last execute call", pb_utils.MetricFamily.GAUGE
        )
        self.last_batch = self.batch.Metric()
        self.rows = pb_utils.MetricFamily(
            f"{name}_rows", "rows per request", pb_utils.MetricFamily.HISTOGRAM
        )
        self.rows_metric = self.rows.Metric(buckets=[1.0, 2.0, 4.0])

    def execute(self, requests):
        for request in requests:
            params = json.loads(request.parameters())
            if "gate" in params:
                with open(params["started"], "w") as f:
                    f.write("started")
                while not os.path.exists(params["gate"]):
                    time.sleep(0.01)
        values = [pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() for r in requests]
        if any((v == -2).any() for v in values):
            raise ValueError("asked to raise")
        responses = []
        total = 0
        for value in values:
            total += value.shape[0]
            self.rows_metric.observe(float(value.shape[0]))
            if (value < 0).any():
                self.failed.increment(1)
                responses.append(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError("negative input"))
                )
                continue
            self.ok.increment(1)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
        self.last_batch.set(float(total))
        return responses
