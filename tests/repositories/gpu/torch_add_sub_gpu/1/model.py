"""Sum and difference computed with torch on this instance's GPU, answered as CUDA tensors.

DEVICE: [model_instance_device_id, torch's current device, the kind is GPU (1) or not (0)].
"""

import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.device_id = int(args["model_instance_device_id"])
        self.is_gpu = args["model_instance_kind"] == "GPU"
        self.device = torch.device(f"cuda:{self.device_id}")

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            x = torch.from_dlpack(a.to_dlpack()).to(self.device)
            y = torch.from_dlpack(b.to_dlpack()).to(self.device)
            where = np.array(
                [self.device_id, torch.cuda.current_device(), int(self.is_gpu)], np.int32
            )
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor.from_dlpack("OUTPUT0", x + y),
                        pb_utils.Tensor.from_dlpack("OUTPUT1", x - y),
                        pb_utils.Tensor("DEVICE", where),
                    ]
                )
            )
        return responses
