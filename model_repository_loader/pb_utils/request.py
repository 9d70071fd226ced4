"""`pb_utils.InferenceRequest`: requests handed to `execute`, and BLS requests built by models.

Incoming requests are made by the loader with `InferenceRequest._incoming(...)`. The public
constructor is the BLS one and checks its arguments the way Triton's pybind binding does:
conversion failures are TypeErrors, content problems are TritonModelExceptions with Triton's texts.

BLS runs in the calling instance's repository: its `ModelServices.bls` (services.py), which every
`LoadedRepository` sets to an executor bound to its models (model_repository_loader/composition/
bls.py). Without one (no repository loaded) `exec` / `async_exec` raise a TritonModelException.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import operator
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import context, services
from .errors import TritonModelException, bind_arguments, pybind_type_error
from .memory import PreferredMemory
from .tensor import Tensor

if TYPE_CHECKING:
    from .response import InferenceResponse
    from .response_iterator import ResponseIterator
    from .response_sender import InferenceResponseSender

_UINT32 = 1 << 32
_UINT64 = 1 << 64
_INT64 = 1 << 63


class InferenceTrace:
    """The trace a request belongs to; `get_context()` is None when tracing is off."""

    __slots__ = ("_context", "_request_trace")

    def __init__(self, trace_context: str = "", request_trace: Any = None) -> None:
        self._context = trace_context
        # The loader's trace of the request it belongs to (tracing.py), for BLS calls.
        self._request_trace = request_trace

    def get_context(self) -> str | None:
        return self._context or None


_ARGUMENTS = (
    "request_id",
    "correlation_id",
    "inputs",
    "requested_output_names",
    "model_name",
    "model_version",
    "flags",
    "timeout",
    "preferred_memory",
    "trace",
    "parameters",
)
_REQUIRED = ("inputs", "requested_output_names", "model_name")
_SIGNATURE = (
    "c_python_backend_utils.InferenceRequest(request_id: str = '', correlation_id: object = 0, "
    "inputs: List[triton::backend::python::PbTensor], requested_output_names: List[str], "
    "model_name: str, model_version: int = -1, flags: int = 0, timeout: int = 0, "
    "preferred_memory: c_python_backend_utils.PreferredMemory = "
    "<c_python_backend_utils.PreferredMemory object>, trace: "
    "c_python_backend_utils.InferenceTrace = <c_python_backend_utils.InferenceTrace object>, "
    "parameters: object = None)"
)


def _never_cancelled() -> bool:
    return False


class InferenceRequest:
    """A request: one of the `requests` given to `execute`, or a BLS request a model builds."""

    __slots__ = (
        "_request_id",
        "_correlation_id",
        "_inputs",
        "_requested_output_names",
        "_model_name",
        "_model_version",
        "_flags",
        "_timeout",
        "_preferred_memory",
        "_trace",
        "_parameters",
        "_response_sender",
        "_is_cancelled",
        "_release_flags",
        "__weakref__",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        params = bind_arguments(_ARGUMENTS, args, kwargs)
        if params is None or not _convert(params):
            raise pybind_type_error("__init__", _SIGNATURE, args, kwargs)
        # From here on the checks of Triton's constructor body, in its order.
        parameters = params["parameters"]
        if parameters is None:
            parameters = {}
        elif not isinstance(parameters, dict):
            raise TritonModelException(f"Expect N8pybind114dictE, got {type(parameters)}")
        parameters_json = parameters_to_json(parameters)
        correlation_id = params["correlation_id"]
        if isinstance(correlation_id, int):
            if not 0 <= correlation_id < _UINT64:
                raise RuntimeError(
                    "Unable to cast Python instance to C++ type (#define "
                    "PYBIND11_DETAILED_ERROR_MESSAGES or compile in debug mode for details)"
                )
            correlation_id = int(correlation_id)
        elif isinstance(correlation_id, str):
            pass
        else:
            raise TritonModelException("Correlation ID must be integer or string")
        request_id, model_name = params["request_id"], params["model_name"]
        where = f"for request with id '{request_id}' and model name '{model_name}'"
        for tensor in params["inputs"]:
            if tensor is None:
                raise TritonModelException(f"Input tensor {where} should not be empty.")
        for output in params["requested_output_names"]:
            if output == "":
                raise TritonModelException(f"Requested output name {where} should not be empty.")

        self._request_id = request_id
        self._correlation_id = correlation_id
        self._inputs = params["inputs"]
        # A set, as in Triton: duplicates collapse; empty means "every output" [V].
        self._requested_output_names = set(params["requested_output_names"])
        self._model_name = model_name
        self._model_version = params["model_version"]
        self._flags = params["flags"]
        self._timeout = params["timeout"]
        self._preferred_memory = params["preferred_memory"]
        self._trace = params["trace"]
        self._parameters = parameters_json
        self._response_sender: InferenceResponseSender | None = None
        self._is_cancelled = _never_cancelled
        self._release_flags = 1

    @classmethod
    def _incoming(
        cls,
        *,
        inputs: list[Tensor],
        request_id: str = "",
        correlation_id: int | str = 0,
        flags: int = 0,
        timeout: int = 0,
        parameters_json: str = "{}",
        requested_output_names: set[str],
        response_sender: InferenceResponseSender | None,
        is_cancelled: Callable[[], bool] | threading.Event | None = None,
        trace: InferenceTrace | None = None,
        model_name: str = "",
        model_version: int = -1,
    ) -> InferenceRequest:
        """A request for `execute`, built by the loader from a validated client request.

        `flags`: SEQUENCE_START (1) | SEQUENCE_END (2). `timeout`: µs, 0 if none.
        `parameters_json`: the compact JSON object of custom parameters ("{}" if none).
        `requested_output_names`: the client's list, or every config output if it named none.
        `is_cancelled`: a callable (or threading.Event) telling whether the client cancelled.
        """
        request = cls.__new__(cls)
        request._request_id = request_id
        request._correlation_id = correlation_id
        request._inputs = inputs
        request._requested_output_names = requested_output_names
        request._model_name = model_name
        request._model_version = model_version
        request._flags = flags
        request._timeout = timeout
        request._preferred_memory = _DEFAULT_MEMORY
        request._trace = trace if trace is not None else _NO_TRACE
        request._parameters = parameters_json
        request._response_sender = response_sender
        if is_cancelled is None:
            is_cancelled = _never_cancelled
        elif isinstance(is_cancelled, threading.Event):
            is_cancelled = is_cancelled.is_set
        request._is_cancelled = is_cancelled
        request._release_flags = 1
        return request

    # -- accessors ------------------------------------------------------------------------

    def inputs(self) -> list[Tensor]:
        return list(self._inputs)

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = _unsigned(flags, _UINT32, "set_flags", self)

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return self._parameters

    def requested_output_names(self) -> set[str]:
        return set(self._requested_output_names)

    def trace(self) -> InferenceTrace:
        return self._trace

    def get_response_sender(self) -> InferenceResponseSender:
        if self._response_sender is None:
            raise TritonModelException(
                "A response sender is only available for requests passed to 'execute'."
            )
        return self._response_sender

    def is_cancelled(self) -> bool:
        return bool(self._is_cancelled())

    def set_release_flags(self, flags: int) -> None:
        self._release_flags = _unsigned(flags, _UINT32, "set_release_flags", self)

    # -- BLS ------------------------------------------------------------------------------

    def exec(self, decoupled: bool = False) -> InferenceResponse | ResponseIterator:
        return self._run(_as_bool(decoupled, "exec", self))

    def async_exec(self, decoupled: bool = False) -> asyncio.Future[Any]:
        """An awaitable running `exec` in the running loop's default executor, as Triton does."""
        decoupled = _as_bool(decoupled, "async_exec", self)
        loop = asyncio.get_running_loop()  # RuntimeError outside a running loop, as in Triton
        # The executor thread sees the caller's model and phase.
        snapshot = contextvars.copy_context()
        return loop.run_in_executor(None, snapshot.run, self._run, decoupled)

    def _run(self, decoupled: bool) -> InferenceResponse | ResponseIterator:
        if not context.bls_allowed():
            raise TritonModelException("BLS is only supported during the 'execute' function.")
        owner = services.current()
        executor = owner.bls if owner is not None else None
        if executor is None:
            raise TritonModelException(
                "BLS requests (InferenceRequest.exec / async_exec) are not supported yet by "
                "dynamo-bridge outside a loaded model repository (load_repository)."
            )
        return executor(self, decoupled)

    def __repr__(self) -> str:
        return f"<InferenceRequest id={self._request_id!r} inputs={len(self._inputs)}>"


_DEFAULT_MEMORY = PreferredMemory._default()
_NO_TRACE = InferenceTrace()


def parameters_to_json(parameters: dict[Any, Any]) -> str:
    """Triton's check and encoding of request/response `parameters` (bool/int/str values)."""
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(
                f"Expect parameters keys to have type str, found type {type(key)}"
            )
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(value)}"
            )
    return json.dumps(parameters)


def _convert(params: dict[str, Any]) -> bool:
    """Apply pybind's argument conversions in place; False where pybind would refuse."""
    if any(name not in params for name in _REQUIRED):
        return False
    for name in ("request_id", "model_name"):
        value = params.get(name, "")
        if isinstance(value, bytes):
            value = value.decode()
        if not isinstance(value, str):
            return False
        params[name] = value
    if params.setdefault("correlation_id", 0) is None:
        return False
    inputs = params["inputs"]
    if not _is_sequence(inputs) or not all(t is None or isinstance(t, Tensor) for t in inputs):
        return False
    params["inputs"] = list(inputs)
    names = params["requested_output_names"]
    if not _is_sequence(names):
        return False
    names = [n.decode() if isinstance(n, bytes) else n for n in names]
    if not all(isinstance(n, str) for n in names):
        return False
    params["requested_output_names"] = names
    for name, default, low, high in (
        ("model_version", -1, -_INT64, _INT64),
        ("flags", 0, 0, _UINT32),
        ("timeout", 0, 0, _UINT64),
    ):
        value = _index(params.setdefault(name, default))
        if value is None or not low <= value < high:
            return False
        params[name] = value
    memory = params.setdefault("preferred_memory", _DEFAULT_MEMORY)
    trace = params.setdefault("trace", _NO_TRACE)
    params.setdefault("parameters", None)
    return isinstance(memory, PreferredMemory) and isinstance(trace, InferenceTrace)


def _is_sequence(value: Any) -> bool:
    return isinstance(value, (list, tuple))


def _index(value: Any) -> int | None:
    if isinstance(value, float):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _unsigned(value: Any, limit: int, method: str, request: InferenceRequest) -> int:
    number = _index(value)
    if number is None or not 0 <= number < limit:
        raise pybind_type_error(
            method,
            "(self: c_python_backend_utils.InferenceRequest, arg0: int) -> None",
            (request, value),
            {},
        )
    return number


def _as_bool(value: Any, method: str, request: InferenceRequest) -> bool:
    if value is None:
        raise pybind_type_error(
            method,
            "(self: c_python_backend_utils.InferenceRequest, decoupled: bool = False) -> object",
            (request, value),
            {},
        )
    return bool(value)
