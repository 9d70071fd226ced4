"""INFO = JSON of what the request tells the model; OUTPUT0 = INPUT0 (an echo).

Two outputs so that requested-output filtering can be observed from the client.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


def describe(request, batch_size):
    correlation_id = request.correlation_id()
    raw_parameters = request.parameters()
    parameters = json.loads(raw_parameters)
    return {
        "request_id": request.request_id(),
        "correlation_id": correlation_id,
        "correlation_id_type": type(correlation_id).__name__,
        "flags": request.flags(),
        "timeout": request.timeout(),
        # Key order inside the raw JSON is not stable on Triton: compare the parsed dict, and
        # only check that the raw text is compact (no spaces after the separators).
        "parameters": parameters,
        "parameters_compact": raw_parameters
        == json.dumps(parameters, separators=(",", ":"), ensure_ascii=False),
        "requested_output_names": sorted(request.requested_output_names()),
        "input_names": sorted(tensor.name() for tensor in request.inputs()),
        "input_shapes": {tensor.name(): tensor.shape() for tensor in request.inputs()},
        "requests_in_execute": batch_size,
    }


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            info = json.dumps(describe(request, len(requests)), sort_keys=True)
            outputs = [pb_utils.Tensor("INFO", np.array([info.encode("utf-8")], dtype=np.object_))]
            # Triton 2.51 lets a request without INPUT0 through when INPUT1 is sent (the model
            # has an optional input), so echo only what is there.
            echo = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            if echo is not None:
                outputs.append(pb_utils.Tensor("OUTPUT0", echo.as_numpy()))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
