"""MODE 0 answers with the PID, 1 writes `dying` beside the model and kills the process 2 s
later, 2 answers after 1 s.

After the first start the model writes a marker beside itself; a restarted instance finds it and
takes 2 s to initialize, so a test can see the model not ready while no instance is alive.
"""

import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_dir = args["model_repository"]
        marker = os.path.join(self.model_dir, "started")
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
                # Tell the test this request is running, so it can queue another behind it.
                with open(os.path.join(self.model_dir, "dying"), "w") as f:
                    f.write(str(os.getpid()))
                # Long enough for the test to queue its next request even on a busy machine.
                time.sleep(2)
                os._exit(7)
            if mode == 2:
                time.sleep(1)
            pid = np.array([os.getpid()], np.int64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PID", pid)]))
        return responses
