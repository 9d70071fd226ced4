"""BLS probe: runs the BLS call described by the JSON in SPEC and answers what it got, as JSON.

SPEC keys: model, inputs [[name, datatype, values]], outputs, version, decoupled, timeout,
parameters, correlation_id, flags, request_id, cancel_after (decoupled: cancel after k responses).
INFO: {"responses": [{"error": [code, message] | null, "outputs": {name: [datatype, values]}}]}
or {"raised": "<exception type>: <message>"} when building or running the request raised.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

DTYPES = {"FP32": np.float32, "INT32": np.int32, "BYTES": object}


def build(spec):
    inputs = [
        pb_utils.Tensor(name, np.array(values, dtype=DTYPES[datatype]))
        for name, datatype, values in spec.get("inputs", [])
    ]
    kwargs = {
        key: spec[key]
        for key in (
            "model_version",
            "timeout",
            "parameters",
            "correlation_id",
            "flags",
            "request_id",
        )
        if key in spec
    }
    return pb_utils.InferenceRequest(
        model_name=spec["model"],
        inputs=inputs,
        requested_output_names=spec.get("outputs", []),
        **kwargs,
    )


def describe(response):
    error = response.error() if response.has_error() else None
    outputs = {}
    for tensor in response.output_tensors():
        array = tensor.as_numpy()
        values = [v.decode() if isinstance(v, bytes) else v for v in array.ravel().tolist()]
        outputs[tensor.name()] = [str(array.dtype), list(array.shape), values]
    return {
        "error": [int(error.code()), error.message()] if error is not None else None,
        "outputs": outputs,
    }


def collect(result, spec):
    if not spec.get("decoupled"):
        return [describe(result)]
    seen = []
    for response in result:
        seen.append(describe(response))
        if spec.get("cancel_after") == len(seen):
            result.cancel()
    return seen


def answer(info):
    text = np.array([json.dumps(info, sort_keys=True).encode()], dtype=object)
    return pb_utils.InferenceResponse([pb_utils.Tensor("INFO", text)])


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            spec = json.loads(pb_utils.get_input_tensor_by_name(request, "SPEC").as_numpy()[0])
            try:
                result = build(spec).exec(decoupled=spec.get("decoupled", False))
                info = {"responses": collect(result, spec)}
            except Exception as exc:
                info = {"raised": f"{type(exc).__name__}: {exc}"}
            responses.append(answer(info))
        return responses
