"""Decoupled: response k is [k, k, k, k] computed on the GPU, sent from a response thread."""

import threading

import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.device = torch.device(f"cuda:{args['model_instance_device_id']}")

    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            sender = request.get_response_sender()
            threading.Thread(target=self._send, args=(sender, count), daemon=True).start()
        return None

    def _send(self, sender, count):
        for k in range(count):
            out = torch.full((4,), float(k), device=self.device)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("OUT", out)]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
