"""`pb_utils.InferenceResponse`: output tensors, or an error, plus optional parameters."""

from __future__ import annotations

from typing import Any

from .errors import TritonError, TritonModelException, pybind_type_error
from .request import parameters_to_json
from .tensor import Tensor

_SIGNATURE = (
    "c_python_backend_utils.InferenceResponse(output_tensors: "
    "List[c_python_backend_utils.Tensor] = [], error: c_python_backend_utils.TritonError = None, "
    "parameters: object = None)"
)
_NO_TENSORS: tuple[Tensor, ...] = ()


class InferenceResponse:
    """`InferenceResponse(output_tensors=[], error=None, parameters=None)`.

    `parameters` (bool/int/str values) is the 25.02+ argument; Triton 2.51 did not have it.
    """

    __slots__ = ("_output_tensors", "_error", "_parameters", "__weakref__")

    def __init__(
        self,
        output_tensors: list[Tensor] | tuple[Tensor, ...] = _NO_TENSORS,
        error: TritonError | None = None,
        parameters: dict[str, bool | int | str] | None = None,
    ) -> None:
        # pybind converts first (TypeError), then the constructor body checks, in this order:
        # parameters, then empty (None) output tensors.
        if not isinstance(output_tensors, (list, tuple)) or not (
            error is None or isinstance(error, TritonError)
        ):
            raise self._type_error(output_tensors, error, parameters)
        tensors = list(output_tensors)
        has_none = False
        for tensor in tensors:
            if not isinstance(tensor, Tensor):
                if tensor is not None:
                    raise self._type_error(output_tensors, error, parameters)
                has_none = True
        if parameters is None:
            self._parameters = "{}"
        elif isinstance(parameters, dict):
            self._parameters = parameters_to_json(parameters)
        else:
            raise TritonModelException(f"Expect N8pybind114dictE, got {type(parameters)}")
        if has_none:
            raise TritonModelException("Output tensor for inference response should not be empty.")
        self._output_tensors = tensors
        self._error = error

    @classmethod
    def _create(
        cls,
        output_tensors: list[Tensor],
        error: TritonError | None = None,
        parameters_json: str = "{}",
    ) -> InferenceResponse:
        """A response without argument checks (BLS results, loader-made responses)."""
        response = cls.__new__(cls)
        response._output_tensors = output_tensors
        response._error = error
        response._parameters = parameters_json
        return response

    @staticmethod
    def _type_error(output_tensors: Any, error: Any, parameters: Any) -> TypeError:
        kwargs = {"parameters": parameters} if parameters is not None else {}
        return pybind_type_error("__init__", _SIGNATURE, (output_tensors, error), kwargs)

    def output_tensors(self) -> list[Tensor]:
        return list(self._output_tensors)

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        """The response parameters as a JSON object text ("{}" when none)."""
        return self._parameters

    def __repr__(self) -> str:
        if self._error is not None:
            return f"<InferenceResponse error={self._error.message()!r}>"
        names = [t.name() for t in self._output_tensors]
        return f"<InferenceResponse outputs={names}>"
