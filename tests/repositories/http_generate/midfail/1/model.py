import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            s = r.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(r, "N").as_numpy()[0])
            s.send(pb_utils.InferenceResponse([pb_utils.Tensor("V", np.array([1], np.int32))]))
            s.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("boom in the middle")))
            if n > 0:
                s.send(pb_utils.InferenceResponse([pb_utils.Tensor("V", np.array([2], np.int32))]))
            s.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
