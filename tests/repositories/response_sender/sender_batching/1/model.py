"""A default-mode (non-decoupled) model answering through its response sender.

Each request picks what the model does with its request parameter `case` (see CASES). Every
response carries OUT = IN + a tag saying where it came from: +1 returned from `execute`, +100
sent before `execute` returns, +200 sent after it returned (from another thread), +300 a
second send. `execute` returns None when no request of the batch returns a response, else a list
with None for the requests answered through their sender.

The same file serves `sender` (thread instance), `sender_process` (process instance) and
`sender_batching` (dynamic batching); tests check that the copies are identical.
"""

import json
import threading
import time

import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
RETURNED, BEFORE, AFTER, SECOND = 1, 100, 200, 300
AFTER_RETURN_S = 0.5

# case -> (steps before return, what execute returns for it, steps after return)
# A step is "send" (a response, no flag), "send_final" (a response with FINAL), "final" (a
# flag-only FINAL) or "second" (a second response, no flag).
CASES = {
    "final_before": (["send_final"], None, []),
    "final_before_list": (["send_final"], "none_in_list", []),
    "final_after": ([], None, ["send_final"]),
    "split_before": (["send", "final"], None, []),
    "split_across": (["send"], None, ["final"]),
    "split_after": ([], None, ["send", "final"]),
    "returned": ([], "response", []),
    "final_before_and_returned": (["send_final"], "response", []),
    "returned_and_after": ([], "response", ["send_final"]),
    "sent_and_returned": (["send"], "response", []),
    "final_first": (["final"], None, []),
    "two_sends": (["send", "second"], None, []),
}


def _response(values, tag):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", values + tag)])


def _run(steps, sender, values, tag):
    for step in steps:
        if step == "send":
            sender.send(_response(values, tag))
        elif step == "send_final":
            sender.send(_response(values, tag), FINAL)
        elif step == "final":
            sender.send(flags=FINAL)
        elif step == "second":
            sender.send(_response(values, SECOND))


class TritonPythonModel:
    def execute(self, requests):
        returned = []
        later = []
        for request in requests:
            case = json.loads(request.parameters())["case"]
            before, on_return, after = CASES[case]
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            _run(before, sender, values, BEFORE)
            returned.append(_response(values, RETURNED) if on_return == "response" else None)
            if after:
                later.append((after, sender, values))
        if later:
            # Sent from another thread, a while after execute returned (as Triton's own test
            # model does): no signal tells a model that its execute has returned.
            def send_later():
                time.sleep(AFTER_RETURN_S)
                for steps, sender, values in later:
                    try:
                        _run(steps, sender, values, AFTER)
                    except pb_utils.TritonModelException as exc:
                        pb_utils.Logger.log_warn(f"send after return failed: {exc}")

            threading.Thread(target=send_later, daemon=True).start()
        wants_list = any(
            CASES[json.loads(r.parameters())["case"]][1] is not None for r in requests
        )
        return returned if wants_list else None
