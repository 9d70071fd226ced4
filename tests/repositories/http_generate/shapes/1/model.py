import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            ts = []
            for n in "ABC":
                t = pb_utils.get_input_tensor_by_name(r, n)
                shape = np.array(t.as_numpy().shape if t is not None else [], np.int64)
                ts.append(pb_utils.Tensor(n + "_SHAPE", shape))
            ts.append(
                pb_utils.Tensor("A_OUT", pb_utils.get_input_tensor_by_name(r, "A").as_numpy())
            )
            out.append(pb_utils.InferenceResponse(ts))
        return out
