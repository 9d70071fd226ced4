"""A slow decoupled model that stops when the client cancels.

It sends a response (OUT = step) every `interval_ms` (request parameter, default 20) until
`request.is_cancelled()`, for at most `steps` (default 1000) steps. With the request parameter
`report` (a file path) it writes there, as JSON, what it saw once it stopped: the step it stopped
at, both cancellation flags, and what sending after the cancellation did.
"""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            params = json.loads(request.parameters())
            sender = request.get_response_sender()
            interval = params.get("interval_ms", 20) / 1000.0
            step = 0
            while step < params.get("steps", 1000) and not request.is_cancelled():
                out = pb_utils.Tensor("OUT", np.array([step], dtype=np.int32))
                sender.send(pb_utils.InferenceResponse([out]))
                step += 1
                time.sleep(interval)
            report = {
                "steps": step,
                "request_cancelled": request.is_cancelled(),
                "sender_cancelled": sender.is_cancelled(),
            }
            try:
                out = pb_utils.Tensor("OUT", np.array([-1], dtype=np.int32))
                sender.send(
                    pb_utils.InferenceResponse([out]),
                    pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                report["send_after"] = "ok"
            except Exception as exc:
                report["send_after"] = f"{type(exc).__name__}: {exc}"
            if params.get("report"):
                # Written whole, then renamed: a test that sees the file reads all of it.
                with open(params["report"] + ".tmp", "w") as f:
                    json.dump(report, f)
                os.replace(params["report"] + ".tmp", params["report"])
        return None
