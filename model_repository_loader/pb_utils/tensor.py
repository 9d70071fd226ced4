"""`pb_utils.Tensor`: a named numpy array with a Triton datatype.

A tensor references the caller's array (C-contiguous arrays are not copied, so later writes to
the array show through, as in Triton [V]). BYTES tensors keep the array the model gave (an object
array of anything, or an `S` array); the `bytes` elements that go on the wire are produced on
demand by `_wire_array()`, which is where the per-element work happens. BF16 tensors hold the raw
16-bit patterns in a uint16 array and are only reachable through DLPack, as in Triton.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dlpack
from .constants import DATATYPE_CODES, NUMPY_TO_DATATYPE
from .errors import TritonModelException, pybind_type_error

_SIGNATURE = "c_python_backend_utils.Tensor(arg0: str, arg1: numpy.ndarray)"
_FROM_DLPACK_SIGNATURE = "(self: str, arg0: object) -> c_python_backend_utils.Tensor"
_OBJECT = np.dtype(np.object_)


class Tensor:
    """`Tensor(name, array)`: both arguments positional, as pybind exposes them."""

    __slots__ = ("_name", "_array", "_datatype", "__weakref__")

    _name: str
    # The stored array: what `as_numpy()` returns; uint16 bit patterns for BF16.
    _array: np.ndarray
    # KServe datatype name: "FP32", "BYTES", "BF16", ...
    _datatype: str

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if len(args) != 2 or kwargs:
            raise pybind_type_error("__init__", _SIGNATURE, args, kwargs)
        name, array = args
        if type(name) is not str:
            if isinstance(name, bytes):  # pybind's str caster takes bytes [V]
                name = name.decode()
            elif not isinstance(name, str):
                raise pybind_type_error("__init__", _SIGNATURE, args, kwargs)
        if not isinstance(array, np.ndarray):
            raise pybind_type_error("__init__", _SIGNATURE, args, kwargs)
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        datatype = NUMPY_TO_DATATYPE.get(array.dtype)
        if datatype is None:
            if array.dtype.type is not np.bytes_:
                raise TritonModelException("NumPy dtype is not supported.")
            datatype = "BYTES"
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        self._name = name
        self._array = array
        self._datatype = datatype

    @classmethod
    def _from_wire(cls, name: str, array: np.ndarray, datatype: str) -> Tensor:
        """A tensor over `array` as-is (no checks, no copy), for the loader and the codec.

        `datatype` is the KServe name. The array must already have the stored form of that
        datatype: a C-contiguous array of the matching numpy dtype, an object array of `bytes`
        for BYTES, the uint16 bit patterns for BF16. Inputs handed to a model should be
        writable, since Triton gives models writable copies [V].
        """
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        tensor._datatype = datatype
        return tensor

    def _wire_array(self) -> np.ndarray:
        """The array in its transport form; for BYTES an object array of `bytes`.

        Elements of a BYTES tensor that are not `bytes` become `str(x).encode("utf-8")`, as
        Triton serializes them (an int 7 goes out as b"7"); `S` arrays lose trailing NULs, as
        numpy reads them [V]. Returns the stored array itself when nothing needs converting.
        """
        array = self._array
        if self._datatype != "BYTES":
            return array
        if array.dtype.kind != "O":
            return array.astype(_OBJECT)
        items = array.reshape(-1).tolist()
        if all(type(item) is bytes for item in items):
            return array
        converted = np.empty(len(items), dtype=_OBJECT)
        converted[:] = [
            item if type(item) is bytes else str(item).encode("utf-8") for item in items
        ]
        return converted.reshape(array.shape)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        if self._datatype == "BF16":
            raise TritonModelException(
                "Tensor dtype is BF16 and cannot be converted to NumPy. "
                "Use to_dlpack() and from_dlpack() instead."
            )
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> int:
        """The TRITONSERVER_DataType code (BOOL=1 ... BYTES=13, BF16=14).

        Real Triton fails on this call (its enum isn't registered with pybind); a code is a
        safe superset.
        """
        return DATATYPE_CODES[self._datatype]

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        if self._datatype == "BYTES":
            raise TritonModelException("DLPack does not have support for string tensors.")
        return dlpack.export_array(self._array, self._datatype)

    def __dlpack__(
        self,
        stream: Any = None,
        *,
        max_version: tuple[int, int] | None = None,
        dl_device: Any = None,
        copy: bool | None = None,
    ) -> Any:
        # `max_version` & co. come from newer consumers (Triton only takes `stream`); they get a
        # versioned capsule, which keeps the data writable on their side.
        if self._datatype == "BYTES":
            raise TritonModelException("DLPack does not have support for string tensors.")
        return dlpack.export_array(self._array, self._datatype, max_version)

    def __dlpack_device__(self) -> tuple[int, int]:
        return dlpack.CPU_DEVICE

    @staticmethod
    def from_dlpack(*args: Any, **kwargs: Any) -> Tensor:
        """`Tensor.from_dlpack(name, capsule_or_dlpack_object)`: zero-copy import."""
        if len(args) != 2 or kwargs:
            raise pybind_type_error("from_dlpack", _FROM_DLPACK_SIGNATURE, args, kwargs)
        name, obj = args
        if isinstance(name, bytes):
            name = name.decode()
        if not isinstance(name, str):
            raise pybind_type_error("from_dlpack", _FROM_DLPACK_SIGNATURE, args, kwargs)
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        array, datatype = dlpack.import_capsule(dlpack.to_capsule(obj))
        return Tensor._from_wire(name, array, datatype)

    def __repr__(self) -> str:
        return f"<Tensor {self._name!r} {self._datatype} {list(self._array.shape)}>"
