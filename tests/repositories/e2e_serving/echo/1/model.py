"""OUTPUT0 = INPUT0; TEXT = each value formatted with '{:g}'; PARAMS = request.parameters()
as the model received it; REQUEST_ID = request.request_id(). finalize() leaves a marker."""

import os
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.instance_name = args["model_instance_name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            text = np.array([f"{v:g}".encode() for v in values], dtype=np.object_)
            outputs = [
                pb_utils.Tensor("OUTPUT0", values),
                pb_utils.Tensor("TEXT", text),
                pb_utils.Tensor("PARAMS", np.array([request.parameters().encode()], np.object_)),
                pb_utils.Tensor(
                    "REQUEST_ID", np.array([request.request_id().encode()], np.object_)
                ),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses

    def finalize(self):
        # The test that stops the server names a folder; one marker file per instance.
        folder = os.environ.get("E2E_MARKER_DIR")
        if folder:
            Path(folder, f"{self.instance_name}.finalized").write_text("finalized")
