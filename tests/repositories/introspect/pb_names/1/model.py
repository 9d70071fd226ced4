"""INFO = JSON of the public names pb_utils offers, on the module and on its classes.

Names starting with "_" are left out; so are values that differ between runs.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

CLASSES = (
    "Tensor",
    "InferenceRequest",
    "InferenceResponse",
    "TritonError",
    "TritonModelException",
    "Logger",
    "ModelConfig",
    "MetricFamily",
    "PreferredMemory",
)
ERROR_CODES = (
    "UNKNOWN",
    "INTERNAL",
    "NOT_FOUND",
    "INVALID_ARG",
    "UNAVAILABLE",
    "UNSUPPORTED",
    "ALREADY_EXISTS",
    "CANCELLED",
)
INT_CONSTANTS = (
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
)


def public(obj):
    return sorted(name for name in dir(obj) if not name.startswith("_"))


def names(request):
    tensor = request.inputs()[0]
    return {
        "module": public(pb_utils),
        "classes": {
            name: public(getattr(pb_utils, name)) if hasattr(pb_utils, name) else None
            for name in CLASSES
        },
        "live_request": public(request),
        "live_tensor": public(tensor),
        "live_response_sender": public(request.get_response_sender()),
        "error_codes": {name: int(getattr(pb_utils.TritonError, name)) for name in ERROR_CODES},
        "logger_levels": {
            name: int(getattr(pb_utils.Logger, name))
            for name in ("INFO", "WARNING", "ERROR", "VERBOSE")
        },
        "metric_kinds": {
            name: int(getattr(pb_utils.MetricFamily, name))
            for name in ("COUNTER", "GAUGE", "HISTOGRAM")
        },
        "constants": {name: int(getattr(pb_utils, name)) for name in INT_CONSTANTS},
        "string_to_numpy": {
            key: np.dtype(value).name for key, value in pb_utils.TRITON_STRING_TO_NUMPY.items()
        },
    }


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            info = json.dumps(names(request), sort_keys=True).encode("utf-8")
            tensor = pb_utils.Tensor("INFO", np.array([info], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse([tensor]))
        return responses
