"""Y = thread_pids(X).Y through BLS; logs one line, so the log path out of the process shows."""

import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            pb_utils.Logger.log_info(f"bls_caller: calling thread_pids from pid {os.getpid()}")
            answer = pb_utils.InferenceRequest(
                model_name="thread_pids", requested_output_names=["Y", "PID"], inputs=[x]
            ).exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
                continue
            y = pb_utils.get_output_tensor_by_name(answer, "Y")
            callee = pb_utils.get_output_tensor_by_name(answer, "PID").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("Y", y.as_numpy()),
                        pb_utils.Tensor("CALLER_PID", np.array([os.getpid()], np.int64)),
                        pb_utils.Tensor("CALLEE_PID", callee.astype(np.int64)),
                    ]
                )
            )
        return responses
