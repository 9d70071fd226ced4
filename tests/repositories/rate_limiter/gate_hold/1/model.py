"""Records `run <model>` in the shared log (file-locked); `gate_hold` then holds its execute
(and so resource R) until the file RATE_LIMITER_GATE exists (bounded)."""

import fcntl
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    def execute(self, requests):
        with open(os.environ["RATE_LIMITER_LOG"], "a") as log:
            fcntl.flock(log, fcntl.LOCK_EX)
            log.write(f"run {self.name}\n")
        if self.name == "gate_hold":
            deadline = time.monotonic() + 60
            while not os.path.exists(os.environ["RATE_LIMITER_GATE"]):
                if time.monotonic() > deadline:
                    raise RuntimeError("the test never opened the gate")
                time.sleep(0.01)
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]
            )
            for r in requests
        ]
