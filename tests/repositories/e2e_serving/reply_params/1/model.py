"""Answers with response parameters (Triton 25.02+): the request's custom parameters, echoed with
their types, plus a count of the input's elements."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            parameters = json.loads(request.parameters())
            parameters["element_count"] = int(values.size)
            output = pb_utils.Tensor("OUTPUT0", values)
            responses.append(pb_utils.InferenceResponse([output], parameters=parameters))
        return responses
