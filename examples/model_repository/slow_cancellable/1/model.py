"""slow_cancellable: works through STEPS steps, sending PROGRESS = steps done after each one.

Between steps it checks `request.is_cancelled()` (true once the client cancelled the request,
its deadline passed or it disconnected). A cancelled request stops at once and is closed with a
`TritonError` of code CANCELLED, as Triton's own models do; the client has gone, so nothing
reaches it, but the instance is free for the next request right away instead of finishing work
nobody waits for. (`sender.is_cancelled()` says the same and also works after execute returned,
for models that answer from another thread.)
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.step_seconds = int(config["parameters"]["step_ms"]["string_value"]) / 1000.0

    def execute(self, requests):
        for request in requests:
            steps = int(pb_utils.get_input_tensor_by_name(request, "STEPS").as_numpy()[0])
            sender = request.get_response_sender()
            done = 0
            while done < steps and not request.is_cancelled():
                time.sleep(self.step_seconds)  # one step of work
                done += 1
                progress = pb_utils.Tensor("PROGRESS", np.array([done], dtype=np.int32))
                sender.send(pb_utils.InferenceResponse([progress]), FINAL if done == steps else 0)
            if done < steps:
                pb_utils.Logger.log_info(
                    f"slow_cancellable: cancelled after {done} of {steps} steps"
                )
                error = pb_utils.TritonError("request cancelled", pb_utils.TritonError.CANCELLED)
                sender.send(pb_utils.InferenceResponse(error=error), FINAL)
            elif steps <= 0:
                sender.send(flags=FINAL)  # nothing to do
        return None
