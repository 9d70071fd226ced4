"""The module-level helper functions of `triton_python_backend_utils`.

Lookup helpers and the datatype conversions behave exactly as Triton's (verified on 2.51,
including the odd corners: `serialize_byte_tensor` of an empty array is `()`, a non-bytes dtype
gives None). `get_model_dir()` reads the running instance from `context`. The model loading API is
the calling instance's `ModelServices.control` (services.py); without one it raises "not
supported yet".
"""

from __future__ import annotations

import struct
from typing import Any, Protocol

import numpy as np

from . import context, services
from .constants import TRITON_STRING_TO_NUMPY
from .errors import TritonModelException, bind_arguments, failed_call_text, pybind_type_error

_LENGTH = struct.Struct("<I")

# Triton int datatype code <-> numpy type, for the two conversion helpers.
_CODE_TO_NUMPY = {
    1: np.bool_,
    2: np.uint8,
    3: np.uint16,
    4: np.uint32,
    5: np.uint64,
    6: np.int8,
    7: np.int16,
    8: np.int32,
    9: np.int64,
    10: np.float16,
    11: np.float32,
    12: np.float64,
    13: np.object_,
}


def get_input_tensor_by_name(inference_request: Any, name: str) -> Any:
    """The input Tensor called `name`, or None."""
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: Any, name: str) -> Any:
    """The output Tensor called `name`, or None."""
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The config entry (dict) of input `name`, or None."""
    for entry in model_config["input"] if "input" in model_config else ():
        if entry["name"] == name:
            return entry
    return None


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The config entry (dict) of output `name`, or None."""
    for entry in model_config["output"] if "output" in model_config else ():
        if entry["name"] == name:
            return entry
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    if "model_transaction_policy" in model_config:
        return model_config["model_transaction_policy"]["decoupled"]
    return False


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """Config data_type string -> numpy type; KeyError for unknown ones (e.g. "TYPE_BF16")."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    """Triton datatype code -> numpy type (1 -> np.bool_ ... 13 -> np.object_); else None."""
    for code, numpy_type in _CODE_TO_NUMPY.items():
        if data_type == code:
            return numpy_type
    return None


def numpy_to_triton_type(data_type: Any) -> int | None:
    """numpy type or dtype -> Triton datatype code; None when there is none.

    Compared with `==` like Triton, so `np.dtype("float32")` works but `"float32"`, Python's
    `bool` and `S` dtypes give None [V]; the type `np.bytes_` gives 13.
    """
    for code, numpy_type in _CODE_TO_NUMPY.items():
        if data_type == numpy_type:
            return code
    if data_type == np.bytes_:
        return 13
    return None


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | tuple[()] | None:
    """Object or `S` array -> 4-byte little-endian length + bytes per element, in C order.

    Non-bytes elements of an object array are written as `str(x).encode("utf-8")`.
    An empty array gives `()` and any other dtype gives None, as in Triton [V].
    """
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype == np.object_:
        parts = []
        for item in input_tensor.reshape(-1, order="C").tolist():
            if type(item) is not bytes:
                item = str(item).encode("utf-8")
            parts.append(_LENGTH.pack(len(item)))
            parts.append(item)
        return b"".join(parts)
    if input_tensor.dtype.type == np.bytes_:
        parts = []
        for item in input_tensor.reshape(-1, order="C").tolist():
            parts.append(_LENGTH.pack(len(item)))
            parts.append(item)
        return b"".join(parts)
    return None


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """Inverse of `serialize_byte_tensor`: a 1-D object array of `bytes`."""
    items = []
    offset = 0
    view = memoryview(encoded_tensor)
    end = len(view)
    while offset < end:
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + length > end:
            raise struct.error(f"truncated bytes tensor: element needs {length} bytes at {offset}")
        items.append(bytes(view[offset : offset + length]))
        offset += length
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    return array


def get_model_dir() -> str:
    """The version directory of the running model, e.g. "/models/m/1" [V]."""
    current = context.current_model()
    if current is None:
        raise TritonModelException("get_model_dir() is only available inside a loaded model.")
    return current.version_dir


class ModelControl(Protocol):
    """What the server provides to back `load_model` / `unload_model` / `is_model_ready`.

    A refused or failed call raises an exception whose str() is the server's message (for
    example "explicit model load / unload is not allowed if polling is enabled"); the functions
    below wrap it in Triton's `TritonModelException` text.
    """

    def load_model(self, model_name: str, config: str, files: dict[str, bytes] | None) -> None: ...

    def unload_model(self, model_name: str, unload_dependents: bool) -> None: ...

    def is_model_ready(self, model_name: str, model_version: str) -> bool: ...


def _control() -> ModelControl | None:
    owner = services.current()
    return owner.control if owner is not None else None


def _not_supported(prefix: str, function: str) -> TritonModelException:
    return TritonModelException(f"{prefix}: {function}() is not supported yet by dynamo-bridge.")


def _control_failed(prefix: str, exc: Exception) -> TritonModelException:
    # Triton's text names the calling instance [V]: "Failed to load model: Failed to process
    # the request for model 'loader_0', message: failed to load 'zzz', failed to poll ..."
    if isinstance(exc, TritonModelException):
        return exc
    return TritonModelException(f"{prefix}: {failed_call_text(context.instance_name(), str(exc))}")


def load_model(*args: Any, **kwargs: Any) -> None:
    """`load_model(model_name, config="", files=None)` (explicit model control)."""
    params = bind_arguments(("model_name", "config", "files"), args, kwargs)
    if (
        params is None
        or not isinstance(params.get("model_name"), str)
        or not isinstance(params.setdefault("config", ""), str)
        or not isinstance(params.setdefault("files", None), (dict, type(None)))
    ):
        raise pybind_type_error(
            "load_model",
            "(model_name: str, config: str = '', files: object = None) -> None",
            args,
            kwargs,
        )
    control = _control()
    if control is None:
        raise _not_supported("Failed to load model", "load_model")
    try:
        control.load_model(params["model_name"], params["config"], params["files"])
    except Exception as exc:
        raise _control_failed("Failed to load model", exc) from None


def unload_model(*args: Any, **kwargs: Any) -> None:
    """`unload_model(model_name, unload_dependents=False)`; returns before the unload ends."""
    params = bind_arguments(("model_name", "unload_dependents"), args, kwargs)
    if (
        params is None
        or not isinstance(params.get("model_name"), str)
        or params.setdefault("unload_dependents", False) is None
    ):
        raise pybind_type_error(
            "unload_model",
            "(model_name: str, unload_dependents: bool = False) -> None",
            args,
            kwargs,
        )
    control = _control()
    if control is None:
        raise _not_supported("Failed to unload model", "unload_model")
    try:
        control.unload_model(params["model_name"], bool(params["unload_dependents"]))
    except Exception as exc:
        raise _control_failed("Failed to unload model", exc) from None


def is_model_ready(*args: Any, **kwargs: Any) -> bool:
    """`is_model_ready(model_name, model_version="")`."""
    params = bind_arguments(("model_name", "model_version"), args, kwargs)
    if (
        params is None
        or not isinstance(params.get("model_name"), str)
        or not isinstance(params.setdefault("model_version", ""), str)
    ):
        raise pybind_type_error(
            "is_model_ready",
            "(model_name: str, model_version: str = '') -> bool",
            args,
            kwargs,
        )
    control = _control()
    if control is None:
        raise _not_supported("Failed to check model readiness", "is_model_ready")
    try:
        return control.is_model_ready(params["model_name"], params["model_version"])
    except Exception as exc:
        raise _control_failed("Failed to check model readiness", exc) from None
