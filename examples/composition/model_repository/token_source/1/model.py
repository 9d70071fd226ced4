import numpy as np
import triton_python_backend_utils as pb_utils

WORDS = [b"the", b"quick", b"brown", b"fox", b"jumps", b"over", b"the", b"lazy", b"dog"]


class TritonPythonModel:
    """Decoupled: sends COUNT tokens, one response each, then closes the stream."""

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            for i in range(count):
                if request.is_cancelled():
                    break
                token = np.array([WORDS[i % len(WORDS)]], dtype=object)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("TOKEN", token)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
