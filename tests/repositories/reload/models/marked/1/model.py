"""OUTPUT0 = INPUT0; MARK = the MARK constant below; HELPER = helper.HELPER_MARK.

The reload tests rewrite the MARK line to tell which version of this file answered.
initialize() and finalize() append "init <MARK>" / "finalize <MARK>" to $RELOAD_LOAD_LOG (when
set), so tests can count loads and see old versions finalized.
"""

import os

import numpy as np
import triton_python_backend_utils as pb_utils

from helper import HELPER_MARK

MARK = 1


def record(event):
    log = os.environ.get("RELOAD_LOAD_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{event} {MARK}\n")


class TritonPythonModel:
    def initialize(self, args):
        record("init")

    def finalize(self):
        record("finalize")

    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            outputs = [
                pb_utils.Tensor("OUTPUT0", values),
                pb_utils.Tensor("MARK", np.array([MARK], np.int32)),
                pb_utils.Tensor("HELPER", np.array([HELPER_MARK], np.int32)),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
