"""Records enter/exit in a shared log (file-locked); inside, waits (bounded by
RATE_LIMITER_PATIENCE_S) until the other model is inside too, and says which it saw."""

import fcntl
import json
import os
import time

import triton_python_backend_utils as pb_utils


def log_lines(append=None):
    """The log's lines, read (and `append` written) under an exclusive lock."""
    with open(os.environ["RATE_LIMITER_LOG"], "a+") as log:
        fcntl.flock(log, fcntl.LOCK_EX)
        log.seek(0)
        lines = log.read().splitlines()
        if append is not None:
            log.write(append + "\n")
        return lines


def inside(lines, model):
    entered = sum(1 for line in lines if line == f"enter {model}")
    left = sum(1 for line in lines if line.startswith(f"exit {model} "))
    return entered > left


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.name = args["model_name"]
        self.other = config["parameters"]["OTHER"]["string_value"]

    def execute(self, requests):
        log_lines(f"enter {self.name}")
        deadline = time.monotonic() + float(os.environ.get("RATE_LIMITER_PATIENCE_S", "3"))
        met = False
        while not met and time.monotonic() < deadline:
            met = inside(log_lines(), self.other)
            if not met:
                time.sleep(0.02)
        log_lines(f"exit {self.name} {'met' if met else 'alone'}")
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]
            )
            for r in requests
        ]
