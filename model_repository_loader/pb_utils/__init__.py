"""The `triton_python_backend_utils` module ("pb_utils") that Triton Python models import.

Triton builds it from a Python file plus classes its stub injects from the C++ extension
`c_python_backend_utils`; here it is one package with all of them available at import time.
`install()` registers it under both module names so that

    import triton_python_backend_utils as pb_utils
    import c_python_backend_utils

work in models and in the helper modules they import.

Loader-facing (internal) API: `context` (which instance/phase is running), `Tensor._from_wire`,
`InferenceRequest._incoming`, `InferenceResponse._create`, `InferenceResponseSender(deliver, ...)`,
`ResponseIterator._create`, `services` (`ModelServices`: a repository's BLS executor, model
control and metrics registry), `render_prometheus` (metrics made outside any repository).
"""

from __future__ import annotations

import json  # noqa: F401 - part of Triton's module namespace
import struct  # noqa: F401 - part of Triton's module namespace
import sys

import numpy as np  # noqa: F401 - part of Triton's module namespace

from . import context, services
from .constants import (
    TRITON_STRING_TO_NUMPY,
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_MEMORY_GPU,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
)
from .errors import TritonError, TritonModelException
from .helpers import (
    deserialize_bytes_tensor,
    get_input_config_by_name,
    get_input_tensor_by_name,
    get_model_dir,
    get_output_config_by_name,
    get_output_tensor_by_name,
    is_model_ready,
    load_model,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
    unload_model,
    using_decoupled_model_transaction_policy,
)
from .logger import Logger
from .memory import MemoryType, PreferredMemory
from .metrics import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    REGISTRY,
    Metric,
    MetricFamily,
    MetricKind,
    render_prometheus,
)
from .model_config import ModelConfig
from .request import InferenceRequest, InferenceTrace
from .response import InferenceResponse
from .response_iterator import ResponseIterator
from .response_sender import InferenceResponseSender
from .services import ModelServices
from .tensor import Tensor

MODULE_NAMES = ("triton_python_backend_utils", "c_python_backend_utils")

# In Triton these classes come from the C++ extension, and models see it in type names, e.g.
# "found type '<class 'c_python_backend_utils.InferenceResponse'>'" in execute's return checks.
for _cls in (
    InferenceRequest,
    InferenceResponse,
    InferenceResponseSender,
    ResponseIterator,
    Tensor,
    TritonError,
    TritonModelException,
    Logger,
    MetricFamily,
    Metric,
    PreferredMemory,
    InferenceTrace,
):
    _cls.__module__ = "c_python_backend_utils"


class SharedMemory:
    """Triton's internal `c_python_backend_utils.SharedMemory` (QA only); nothing to free here."""

    def free_memory(self) -> int:
        return 0


shared_memory = SharedMemory()


def async_event_future_done_callback(py_future: object) -> None:
    """Internal callback of Triton's stub (async decoupled execute); not used here."""


def install() -> None:
    """Make `import triton_python_backend_utils` and `import c_python_backend_utils` give this
    package. Idempotent."""
    module = sys.modules[__name__]
    for name in MODULE_NAMES:
        if sys.modules.get(name) is not module:
            sys.modules[name] = module


__all__ = [
    # The name set a Triton 2.51 model sees in triton_python_backend_utils [V].
    "InferenceRequest",
    "InferenceResponse",
    "Logger",
    "MetricFamily",
    "ModelConfig",
    "PreferredMemory",
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_model_dir",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
    # Classes that live only on c_python_backend_utils in Triton.
    "COUNTER",
    "GAUGE",
    "HISTOGRAM",
    "InferenceResponseSender",
    "InferenceTrace",
    "MemoryType",
    "Metric",
    "MetricKind",
    "ResponseIterator",
    "SharedMemory",
    "async_event_future_done_callback",
    "shared_memory",
    # Loader-facing.
    "REGISTRY",
    "context",
    "install",
    "ModelServices",
    "render_prometheus",
    "services",
]
