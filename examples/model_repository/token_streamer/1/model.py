"""token_streamer: sends PROMPT back one token (a word and the spaces after it) per response.

Joining the TOKEN of every response gives the prompt again. After the last token the model
sends a flag-only FINAL: clients that want to see the end of the stream ask for it with
`enable_empty_final_response=True` and get an empty response flagged `triton_final_response`.
"""

import json
import re
import time

import numpy as np
import triton_python_backend_utils as pb_utils

TOKEN = re.compile(r"\S+\s*|\s+")


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.delay = int(config["parameters"]["delay_ms"]["string_value"]) / 1000.0

    def execute(self, requests):
        for request in requests:
            prompt = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy()[0]
            sender = request.get_response_sender()
            for token in TOKEN.findall(prompt.decode("utf-8")):
                time.sleep(self.delay)
                out = pb_utils.Tensor("TOKEN", np.array([token.encode("utf-8")], dtype=np.object_))
                sender.send(pb_utils.InferenceResponse([out]))
            # Closes the request; no more sends are allowed on this sender.
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        # A decoupled model's execute returns None: everything went through the senders.
        return None
