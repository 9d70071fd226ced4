"""Returns a dict of output arrays instead of a list of responses."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        value = pb_utils.get_input_tensor_by_name(requests[0], "INPUT0").as_numpy()
        return {"OUTPUT0": value}
