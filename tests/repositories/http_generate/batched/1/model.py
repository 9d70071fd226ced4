import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [
                    pb_utils.Tensor(
                        "X_SHAPE",
                        np.array(
                            pb_utils.get_input_tensor_by_name(r, "X").as_numpy().shape, np.int64
                        ),
                    )
                ]
            )
            for r in requests
        ]
