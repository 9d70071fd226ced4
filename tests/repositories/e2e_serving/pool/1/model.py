"""A model whose execute the test holds open: OUTPUT0 = INPUT0, INSTANCE = the instance name.

Request parameters (strings, file paths the test chooses):
  started: written (with the instance name) as soon as execute begins;
  gate:    execute waits until this file exists (at most 30 s, then it raises).
finalize() leaves a marker file per instance in $E2E_MARKER_DIR when that is set.
"""

import json
import os
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

GATE_TIMEOUT_S = 30.0


def wait_for(path):
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {path} never opened")
        time.sleep(0.01)


def write_atomically(path, text):
    # The test polls for the file: it must never see it empty.
    Path(f"{path}.tmp").write_text(text)
    os.replace(f"{path}.tmp", path)


class TritonPythonModel:
    def initialize(self, args):
        self.instance_name = args["model_instance_name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            if "started" in params:
                write_atomically(params["started"], self.instance_name)
            if "gate" in params:
                wait_for(params["gate"])
            values = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            instance = np.array([self.instance_name.encode()], dtype=np.object_)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", values), pb_utils.Tensor("INSTANCE", instance)]
                )
            )
        return responses

    def finalize(self):
        folder = os.environ.get("E2E_MARKER_DIR")
        if folder:
            Path(folder, f"{self.instance_name}.finalized").write_text("finalized")
