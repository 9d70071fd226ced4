"""Decoupled-mode mistakes, chosen by the request parameter `action`.

* `raise`: sends one response, then raises `ValueError` from execute.
* `return_list`: sends nothing and returns a list of responses.
* `send_after_final`: sends a response with FINAL, then tries again; the exception text is kept.
* `bad_flags`: tries `send(response, 2)` and `send(None, 0)`; the texts are kept; then FINAL.
* `report`: answers one response whose OUT is the number of texts kept, with the texts joined
  by newlines as the error of a second response; then FINAL.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _response(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))])


class TritonPythonModel:
    def initialize(self, args):
        self.kept = []

    def execute(self, requests):
        for request in requests:
            action = json.loads(request.parameters()).get("action", "")
            sender = request.get_response_sender()
            if action == "raise":
                sender.send(_response(1))
                raise ValueError("misuse raised after one response")
            if action == "return_list":
                return [_response(1)]
            if action == "send_after_final":
                sender.send(_response(1), FINAL)
                self._try(lambda s=sender: s.send(_response(2)))
            elif action == "bad_flags":
                self._try(lambda s=sender: s.send(_response(1), 2))
                self._try(lambda s=sender: s.send(None, 0))
                sender.send(flags=FINAL)
            elif action == "report":
                sender.send(_response(len(self.kept)))
                sender.send(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError("\n".join(self.kept)))
                )
                self.kept = []
                sender.send(flags=FINAL)
        return None

    def _try(self, call):
        try:
            call()
            self.kept.append("no error")
        except Exception as exc:
            self.kept.append(f"{type(exc).__name__}: {exc}")
