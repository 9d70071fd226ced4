import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.version = int(args["model_version"])

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", x * np.float32(self.version))]
                )
            )
        return out
