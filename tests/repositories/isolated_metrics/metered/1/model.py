"""Custom metrics used from an instance process. ANSWER is JSON; OP says what to do:

* "count": increment `metered_calls{by="model"}` from a thread of the model's own, write the
  file named by request parameter `started`, wait until the file `gate` exists, then answer the
  series' value as read now, the value read in `initialize`, the pid and the instance name;
* "errors": the texts of a negative counter increment and of asking for the family again with
  another kind;
* "drop": delete this instance's family object before its metric, then use the metric.

`finalize` logs the series' value ("<instance> finalize read <value>").
"""

import json
import os
import sys
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.instance = args["model_instance_name"]
        self.family = pb_utils.MetricFamily(
            "metered_calls", "calls counted by every instance", pb_utils.MetricFamily.COUNTER
        )
        self.calls = self.family.Metric(labels={"by": "model"})
        self.at_initialize = self.calls.value()

    def finalize(self):
        pb_utils.Logger.log_info(f"{self.instance} finalize read {self.calls.value()}")

    def execute(self, requests):
        return [self._answer(r) for r in requests]

    def _answer(self, request):
        op = pb_utils.get_input_tensor_by_name(request, "OP").as_numpy()[0].decode()
        if op == "count":
            answer = self._count(json.loads(request.parameters()))
        elif op == "errors":
            answer = {
                "negative": _error(lambda: self.calls.increment(-1.0)),
                "other_kind": _error(
                    lambda: pb_utils.MetricFamily(
                        "metered_calls", "again", pb_utils.MetricFamily.GAUGE
                    )
                ),
            }
        else:  # drop
            self.family = None
            answer = {"after_drop": _error(lambda: self.calls.increment(1.0))}
        out = np.array([json.dumps(answer).encode()], dtype=np.object_)
        return pb_utils.InferenceResponse([pb_utils.Tensor("ANSWER", out)])

    def _count(self, params):
        worker = threading.Thread(target=self.calls.increment, args=(1.0,))
        worker.start()
        worker.join()
        with open(params["started"], "w") as f:
            f.write(self.instance)
        while not os.path.exists(params["gate"]):
            time.sleep(0.01)
        return {
            "value": self.calls.value(),
            "at_initialize": self.at_initialize,
            "pid": os.getpid(),
            "instance": self.instance,
            "argv": sys.argv,
        }


def _error(operation):
    try:
        operation()
    except pb_utils.TritonModelException as exc:
        return str(exc)
    return None
