import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Echoes INPUT0 after sleeping the request parameter `sleep_ms` (default 300).

    With the request parameter `meet` (a folder) it sleeps no time: it writes a file named after
    itself there and waits until both `slow` and `slow_b` have (a rendezvous, at most 10 s), so a
    test proves that two ensemble steps run at once without timing them. A step that waited in
    vain answers an error.
    """

    def initialize(self, args):
        self.name = args["model_name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            if params.get("meet"):
                if not self.meet(params["meet"]):
                    error = pb_utils.TritonError(f"{self.name}: the other step never came")
                    responses.append(pb_utils.InferenceResponse(error=error))
                    continue
            else:
                time.sleep(params.get("sleep_ms", 300) / 1000)
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses

    def meet(self, folder):
        open(os.path.join(folder, self.name), "w").close()
        for _ in range(1000):
            if all(os.path.exists(os.path.join(folder, m)) for m in ("slow", "slow_b")):
                return True
            time.sleep(0.01)
        return False
