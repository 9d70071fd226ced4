"""MODE 0 answers with the PID, 1 kills the process after 0.5 s, 2 answers after 1 s.

After the first start the model writes a marker beside itself; a restarted instance finds it and
takes 2 s to initialize, so a test can see the model not ready while no instance is alive.
"""

import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        marker = os.path.join(args["model_repository"], "started")
        if os.path.exists(marker):
            time.sleep(2)
        else:
            with open(marker, "w") as f:
                f.write(str(os.getpid()))

    def execute(self, requests):
        responses = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            if mode == 1:
                time.sleep(0.5)  # lets a test queue another request behind this one
                os._exit(7)
            if mode == 2:
                time.sleep(1)
            pid = np.array([os.getpid()], np.int64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PID", pid)]))
        return responses
