"""`pb_utils.Tensor`: a named numpy array with a Triton datatype.

A tensor references the caller's array (C-contiguous arrays are not copied, so later writes to
the array show through, as in Triton [V]). BYTES tensors keep the array the model gave (an object
array of anything, or an `S` array); the `bytes` elements that go on the wire are produced on
demand by `_wire_array()`, which is where the per-element work happens. BF16 tensors hold the raw
16-bit patterns in a uint16 array and are only reachable through DLPack, as in Triton.

A tensor made from GPU memory (`from_dlpack` of a CUDA tensor, a BLS or ensemble input that
stayed on the GPU) holds a `gpu.DeviceArray` instead and is not `is_cpu()`; `to_dlpack()` hands
the same memory on. Its bytes are copied to the host once, the first time something needs them
as an array (`_array`: the wires, the response cache); the tensor stays a GPU tensor.

A tensor made `_from_source` (a large BYTES input, kept serialized by the bridge's codec while
its request waits for an instance) makes its array the first time something needs it, usually
the model's `as_numpy()` on the instance's thread; its shape is known before.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np

from ..gpu.device_array import DeviceArray
from . import dlpack
from .constants import DATATYPE_CODES, NUMPY_TO_DATATYPE
from .errors import TritonModelException, pybind_type_error

_SIGNATURE = "c_python_backend_utils.Tensor(arg0: str, arg1: numpy.ndarray)"
_FROM_DLPACK_SIGNATURE = "(self: str, arg0: object) -> c_python_backend_utils.Tensor"
_OBJECT = np.dtype(np.object_)


class ArraySource(Protocol):
    """Makes a tensor's array when it is first needed; once, whichever tensor over it asks."""

    def array(self) -> np.ndarray:
        """The array, 1-D (each tensor over the source gives it its own shape)."""
        ...


class Tensor:
    """`Tensor(name, array)`: both arguments positional, as pybind exposes them."""

    __slots__ = ("_name", "_host", "_device", "_datatype", "__weakref__")

    _name: str
    # The stored array: what `as_numpy()` returns; uint16 bit patterns for BF16. For a GPU
    # tensor, None until its bytes are first needed on the host (then a copy).
    _host: np.ndarray | None
    # The GPU memory of a GPU tensor; None for a CPU tensor.
    _device: DeviceArray | None
    # KServe datatype name: "FP32", "BYTES", "BF16", ...
    _datatype: str

    @property
    def _array(self) -> np.ndarray:
        """The tensor as a host array (for a GPU tensor, its host copy, made once)."""
        host = self._host
        if host is None:
            assert self._device is not None
            host = self._host = self._device.to_host()
        return host

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
        self._host = array
        self._device = None
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
        tensor._host = array
        tensor._device = None
        tensor._datatype = datatype
        return tensor

    @staticmethod
    def _from_source(
        name: str, source: ArraySource, shape: tuple[int, ...], datatype: str
    ) -> Tensor:
        """A CPU tensor of `shape` whose array `source` makes when first needed (no checks:
        the source's array must have the stored form of `datatype` and `shape`'s size)."""
        tensor = _Sourced.__new__(_Sourced)
        tensor._name = name
        tensor._host = None
        tensor._device = None
        tensor._datatype = datatype
        tensor._source = source
        tensor._shape = shape
        return tensor

    @classmethod
    def _from_device(cls, name: str, array: DeviceArray, datatype: str) -> Tensor:
        """A GPU tensor over `array` as-is (no checks, no copy)."""
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._host = None
        tensor._device = array
        tensor._datatype = datatype
        return tensor

    def _renamed(self, name: str) -> Tensor:
        """The same memory under another name (host or GPU, no copy)."""
        if self._device is not None:
            return Tensor._from_device(name, self._device, self._datatype)
        return Tensor._from_wire(name, self._array, self._datatype)

    def _reshaped(self, shape: list[int]) -> Tensor:
        """The same memory under another shape (ValueError when the sizes differ)."""
        if self._device is not None:
            return Tensor._from_device(self._name, self._device.reshape(shape), self._datatype)
        return Tensor._from_wire(self._name, self._array.reshape(shape), self._datatype)

    def _on_host(self) -> Tensor:
        """This tensor if it is on the host, else a host copy of it (a CPU tensor)."""
        if self._device is None:
            return self
        host = self._host if self._host is not None else self._device.to_host()
        return Tensor._from_wire(self._name, host, self._datatype)

    def _dims(self) -> tuple[int, ...]:
        """The shape, without copying a GPU tensor to the host."""
        device = self._device
        return device.shape if device is not None else self._array.shape

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
        if self._device is not None:
            raise TritonModelException("Tensor is stored in GPU and cannot be converted to NumPy.")
        if self._datatype == "BF16":
            raise TritonModelException(
                "Tensor dtype is BF16 and cannot be converted to NumPy. "
                "Use to_dlpack() and from_dlpack() instead."
            )
        return self._array

    def shape(self) -> list[int]:
        return list(self._dims())

    def triton_dtype(self) -> int:
        """The TRITONSERVER_DataType code (BOOL=1 ... BYTES=13, BF16=14).

        Real Triton fails on this call (its enum isn't registered with pybind); a code is a
        safe superset.
        """
        return DATATYPE_CODES[self._datatype]

    def is_cpu(self) -> bool:
        return self._device is None

    def to_dlpack(self) -> Any:
        if self._datatype == "BYTES":
            raise TritonModelException("DLPack does not have support for string tensors.")
        if self._device is not None:
            return dlpack.export_device(self._device, self._datatype)
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
        # versioned capsule, which keeps the data writable on their side. GPU memory: as in
        # Triton, no work is pending on it (it was synchronised when it came in), so `stream`
        # needs no wait, and a legacy capsule is what every consumer takes. A consumer that
        # passes `copy=True` trusts the capsule to be a copy (torch then aliases it), so it is
        # one; another device than this tensor's is refused, as the protocol asks.
        if self._datatype == "BYTES":
            raise TritonModelException("DLPack does not have support for string tensors.")
        here = self.__dlpack_device__()
        if dl_device is not None and (int(dl_device[0]), int(dl_device[1])) != here:
            raise BufferError(f"the tensor is on DLPack device {here}, not {tuple(dl_device)}")
        if self._device is not None:
            device = self._device.copy_to(self._device.device) if copy else self._device
            return dlpack.export_device(device, self._datatype)
        array = np.array(self._array) if copy else self._array
        return dlpack.export_array(array, self._datatype, max_version)

    def __dlpack_device__(self) -> tuple[int, int]:
        if self._device is not None:
            return (dlpack.CUDA, self._device.device)
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
        if isinstance(array, DeviceArray):
            return Tensor._from_device(name, array, datatype)
        return Tensor._from_wire(name, array, datatype)

    def __repr__(self) -> str:
        where = "" if self._device is None else f" cuda:{self._device.device}"
        return f"<Tensor {self._name!r} {self._datatype}{where} {list(self._dims())}>"


class _Sourced(Tensor):
    """A CPU tensor whose array its `ArraySource` makes on first use (`Tensor._from_source`).
    Renamed or reshaped before then, it stays unmade: the new tensor shares the source, so
    both see the one array, as they would share a stored one."""

    __slots__ = ("_source", "_shape")

    _source: ArraySource
    _shape: tuple[int, ...]

    @property
    def _array(self) -> np.ndarray:
        host = self._host
        if host is None:
            host = self._host = self._source.array().reshape(self._shape)
        return host

    def _dims(self) -> tuple[int, ...]:
        return self._shape

    def _renamed(self, name: str) -> Tensor:
        if self._host is not None:
            return super()._renamed(name)
        return Tensor._from_source(name, self._source, self._shape, self._datatype)

    def _reshaped(self, shape: list[int]) -> Tensor:
        if self._host is not None:
            return super()._reshaped(shape)
        if math.prod(shape) != math.prod(self._shape):  # as numpy's reshape refuses it
            raise ValueError(f"cannot reshape a tensor of shape {self._shape} into {shape}")
        return Tensor._from_source(self._name, self._source, tuple(shape), self._datatype)
