"""OUT = IN, counting requests in custom metrics. IN = -1 in a request: that request gets an
error response (TritonError); IN = -2: execute raises, failing every request of the call.

Families, named after the model so that two of them never share one: `<model>_requests` (counter,
label `kind="ok"|"failed"`), `<model>_last_batch` (gauge: the rows of the last execute call) and
`<model>_rows` (histogram of each request's rows, buckets 1, 2, 4).
"""

import numpy as np
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
        responses = []
        total = 0
        values = [pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() for r in requests]
        if any((v == -2).any() for v in values):
            raise ValueError("asked to raise")
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

    def finalize(self):
        # Metrics before their family, as Triton asks.
        del self.ok, self.failed, self.last_batch, self.rows_metric
        del self.requests, self.batch, self.rows
