"""A decoupled model faster than any client: it sends until the request is cancelled.

Bounded all the same: it stops by itself after `limit_s` seconds or `limit_n` responses (request
parameters), so a server that never tells it about a client that went away still gets it back.
With `report` (a file path) it writes what happened there once it stopped (README.md).
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
            deadline = time.monotonic() + params.get("limit_s", 20)
            limit = params.get("limit_n", 100000)
            out = np.arange(params.get("elements", 1024), dtype=np.int32)
            sent = 0
            while not request.is_cancelled():
                if sent >= limit or time.monotonic() >= deadline:
                    break
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
                sent += 1
            report = {
                "cancelled": request.is_cancelled(),
                "sent": sent,
                "self_stopped": not request.is_cancelled(),
            }
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            if params.get("report"):
                # Written whole, then renamed: a test that sees the file reads all of it.
                with open(params["report"] + ".tmp", "w") as f:
                    json.dump(report, f)
                os.replace(params["report"] + ".tmp", params["report"])
        return None
