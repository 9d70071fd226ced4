"""DLPack import and export: host memory through numpy, GPU memory through `gpu.DeviceArray`.

BF16 is handled by rewriting the dtype field.

numpy can produce and consume DLPack capsules but has no bfloat16 type. A BF16 tensor is kept as
a uint16 array of its bit patterns, so on export the capsule numpy makes for that array is
relabelled (kDLUInt, 16) -> (kDLBfloat, 16), and on import a (kDLBfloat, 16) capsule is relabelled
the other way before numpy reads it. The consumer owns a capsule's DLManagedTensor once it has it,
so editing the struct in place is allowed; data is never copied.

Producers are asked for a versioned ("dltensor_versioned") capsule where numpy can read one: only
those carry a read-only flag, so numpy imports legacy capsules as read-only arrays.

GPU memory (kDLCUDA) is taken as Triton's stub takes it: an object's `__dlpack__` is given the
legacy default stream and that stream is waited for, so the producer's pending work on the data
is done before the model goes on; a bare capsule is taken as it is. The consumed capsule's
DLManagedTensor is kept, and its deleter called when the last holder of the memory goes
(`_ProducerMemory`). GPU memory goes out as a legacy capsule of our own making
(`export_device`), which keeps the memory alive until its consumer calls the deleter, or until
the capsule is dropped unconsumed. The memory is never copied on either way.
"""

from __future__ import annotations

import ctypes
import weakref
from typing import Any

import numpy as np

from ..gpu.device_array import DeviceArray
from .constants import DATATYPE_TO_NUMPY
from .errors import TritonModelException

# DLDeviceType values.
_KDL_CPU = 1
_KDL_CUDA = 2
_KDL_CUDA_HOST = 3

# DLDataTypeCode values.
_KDL_INT = 0
_KDL_UINT = 1
_KDL_FLOAT = 2
_KDL_BFLOAT = 4
_KDL_BOOL = 6

CPU_DEVICE = (_KDL_CPU, 0)
CUDA = _KDL_CUDA
# DLPack 1.x (versioned capsules) is understood by numpy from 2.1 on.
VERSIONED_SUPPORTED = np.lib.NumpyVersion(np.__version__) >= "2.1.0"
_MAX_VERSION = (1, 0)

_LEGACY = b"dltensor"
_VERSIONED = b"dltensor_versioned"
_USED_LEGACY = b"used_dltensor"
_USED_VERSIONED = b"used_dltensor_versioned"
# DLManagedTensorVersioned = {DLPackVersion (2 x u32), manager_ctx, deleter, u64 flags, DLTensor}.
_VERSIONED_TENSOR_OFFSET = 32


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

_capsule_set_name = ctypes.pythonapi.PyCapsule_SetName
_capsule_set_name.restype = ctypes.c_int
_capsule_set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]

_CAPSULE_TYPE = type(np.empty(0).__dlpack__())

# (DLPack code, bits) -> KServe datatype, for the types Triton accepts from DLPack.
_DLPACK_TO_DATATYPE = {
    (_KDL_INT, 8): "INT8",
    (_KDL_INT, 16): "INT16",
    (_KDL_INT, 32): "INT32",
    (_KDL_INT, 64): "INT64",
    (_KDL_UINT, 8): "UINT8",
    (_KDL_UINT, 16): "UINT16",
    (_KDL_UINT, 32): "UINT32",
    (_KDL_UINT, 64): "UINT64",
    (_KDL_FLOAT, 16): "FP16",
    (_KDL_FLOAT, 32): "FP32",
    (_KDL_FLOAT, 64): "FP64",
    (_KDL_BOOL, 8): "BOOL",
    (_KDL_BFLOAT, 16): "BF16",
}

_DATATYPE_TO_DLPACK = {datatype: key for key, datatype in _DLPACK_TO_DATATYPE.items()}
_NO_GPU = (
    "DLPack capsule passed pointer to memory allocated on GPU device, when GPU is not available"
)
_NOT_SUPPORTED = (
    "Provided tensor is not supported. Tensor must be a DLPack capsule "
    "        or have `__dlpack__` and `__dlpack_device__` attributes"
)
_NOT_CONTIGUOUS = (
    "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored in "
    "C-Order are supported."
)


class _CapsuleHolder:
    """Hands an existing capsule to `np.from_dlpack`, which wants an object, not a capsule."""

    __slots__ = ("_capsule", "_device")

    def __init__(self, capsule: Any, device: tuple[int, int]) -> None:
        self._capsule = capsule
        self._device = device

    def __dlpack__(self, *_: Any, **__: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device


def is_capsule(obj: Any) -> bool:
    return type(obj) is _CAPSULE_TYPE


def to_capsule(obj: Any) -> Any:
    """The capsule for `obj` (a capsule, or an object implementing the DLPack protocol)."""
    if is_capsule(obj):
        return obj
    if not hasattr(obj, "__dlpack__") or not hasattr(obj, "__dlpack_device__"):
        raise TritonModelException(_NOT_SUPPORTED)
    device_type, device_id = obj.__dlpack_device__()
    _check_device(device_type)
    if device_type == _KDL_CUDA:
        return _cuda_capsule(obj, int(device_id))
    # CPU data: `stream=None` is the only value the array API allows.
    if VERSIONED_SUPPORTED:
        try:
            return obj.__dlpack__(stream=None, max_version=_MAX_VERSION)
        except TypeError:  # a producer that predates DLPack 1.0
            pass
    return obj.__dlpack__(stream=None)


def _cuda_capsule(obj: Any, device: int) -> Any:
    """The capsule of a producer's GPU data, once its pending work on the data is done."""
    from ..gpu import cuda  # here: gpu's errors import pb_utils, which imports this module

    try:
        with cuda.on_device(device):
            capsule = obj.__dlpack__(stream=cuda.LEGACY_STREAM)
            cuda.synchronize(cuda.LEGACY_STREAM)
    except cuda.CudaUnavailable as exc:
        raise TritonModelException(f"{_NO_GPU} ({exc})") from None
    return capsule


def import_capsule(capsule: Any) -> tuple[np.ndarray | DeviceArray, str]:
    """Take ownership of a capsule: a C-ordered view of its data (a numpy array, or a
    `DeviceArray` for GPU memory) and its KServe datatype."""
    tensor = _tensor_struct(capsule)
    _check_device(tensor.device.device_type)
    datatype = _datatype(tensor.dtype)
    leading_strided = _check_contiguous(tensor)
    if tensor.device.device_type == _KDL_CUDA:
        return _import_device(capsule, tensor, datatype, leading_strided), datatype
    if datatype == "BF16":
        tensor.dtype.code = _KDL_UINT
    array = np.from_dlpack(_CapsuleHolder(capsule, (tensor.device.device_type, 0)))
    if leading_strided:
        # Triton accepts a stride on the first dimension only (and then misreads the data);
        # here the data is made C-contiguous so it reads as the producer meant.
        array = np.ascontiguousarray(array)
    return array, datatype


def export_array(
    array: np.ndarray, datatype: str, max_version: tuple[int, int] | None = None
) -> Any:
    """A capsule viewing `array` (kept alive by the capsule).

    Legacy ("dltensor", what Triton's `to_dlpack()` returns) unless the consumer asked for
    DLPack >= 1.0 with `max_version` and numpy can produce it.
    """
    if max_version is not None and max_version >= _MAX_VERSION and VERSIONED_SUPPORTED:
        capsule = array.__dlpack__(max_version=_MAX_VERSION)
    else:
        try:
            capsule = array.__dlpack__()
        except BufferError:
            # A legacy capsule cannot say "read-only", so numpy refuses to export read-only
            # arrays that way; a private copy can be exported.
            capsule = np.array(array).__dlpack__()
    if datatype == "BF16":
        _tensor_struct(capsule).dtype.code = _KDL_BFLOAT
    return capsule


def _import_device(
    capsule: Any, tensor: _DLTensor, datatype: str, leading_strided: bool
) -> DeviceArray:
    name = _capsule_name(capsule)
    address = _capsule_pointer(capsule, name)
    shape = [tensor.shape[i] for i in range(tensor.ndim)]
    dtype = np.dtype(np.uint16) if datatype == "BF16" else _numpy_dtype(datatype)
    device = int(tensor.device.device_id)
    pointer = (tensor.data or 0) + tensor.byte_offset
    # Consumed: the name changes so that nobody else takes it, and its deleter is ours to call.
    _capsule_set_name(capsule, _USED_VERSIONED if name == _VERSIONED else _USED_LEGACY)
    owner = _ProducerMemory(address, versioned=name == _VERSIONED)
    array = DeviceArray(pointer, shape, dtype, device, owner)
    if leading_strided:
        # As on the host: made contiguous, so that it reads as the producer meant.
        array = _rows_made_contiguous(array, int(tensor.strides[0]) * dtype.itemsize)
    return array


def _rows_made_contiguous(array: DeviceArray, row_pitch: int) -> DeviceArray:
    from ..gpu import cuda  # here, as in `_cuda_capsule`

    rows = array.shape[0]
    row_bytes = array.nbytes // rows if rows else 0
    allocation = cuda.Allocation(array.nbytes, array.device)
    with cuda.on_device(array.device):
        for row in range(rows):
            cuda.copy(
                allocation.pointer + row * row_bytes, array.pointer + row * row_pitch, row_bytes
            )
    return DeviceArray(allocation.pointer, array.shape, array.dtype, array.device, allocation)


def _numpy_dtype(datatype: str) -> np.dtype:
    return np.dtype(DATATYPE_TO_NUMPY[datatype])


class _ProducerMemory:
    """Holds a consumed DLManagedTensor; its producer's deleter runs when this object goes."""

    __slots__ = ("__weakref__",)

    def __init__(self, address: int, versioned: bool) -> None:
        # Not at exit: the producer (its library, its Python objects) may be gone by then,
        # and the process's memory goes with it anyway.
        weakref.finalize(self, _call_deleter, address, versioned).atexit = False


_DELETER_OFFSET_LEGACY = ctypes.sizeof(_DLTensor) + ctypes.sizeof(ctypes.c_void_p)
_DELETER_OFFSET_VERSIONED = 16
# Producers' deleters are called with the GIL held: numpy's takes it again (allowed), others
# (torch, cupy) do not touch Python.
_PRODUCER_DELETER = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)


def _call_deleter(address: int, versioned: bool) -> None:
    offset = _DELETER_OFFSET_VERSIONED if versioned else _DELETER_OFFSET_LEGACY
    function = ctypes.c_void_p.from_address(address + offset).value
    if function:
        _PRODUCER_DELETER(function)(address)


# -- GPU memory out: capsules of our own making ------------------------------------------------

_EXPORT_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", _DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", _EXPORT_DELETER),
    ]


# The exported structs, their shapes and what keeps their memory alive, by struct address,
# until the consumer calls the deleter (or the capsule is dropped unconsumed). One dict
# operation each way, atomic under the GIL, and no lock: the deleter may run inside a garbage
# collection that an allocation of the exporting thread set off, and a lock held there would
# be waited for by its own thread.
_exports: dict[int, tuple[_DLManagedTensor, Any, DeviceArray]] = {}


@_EXPORT_DELETER
def _release_export(address: int | None) -> None:
    if address is not None:
        _exports.pop(address, None)


_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_capsule_is_valid = ctypes.pythonapi["PyCapsule_IsValid"]
_capsule_is_valid.restype = ctypes.c_int
_capsule_is_valid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_capsule_raw_pointer = ctypes.pythonapi["PyCapsule_GetPointer"]
_capsule_raw_pointer.restype = ctypes.c_void_p
_capsule_raw_pointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]


@_CAPSULE_DESTRUCTOR
def _destroy_capsule(capsule: int | None) -> None:
    # Still named "dltensor": nobody consumed it, so nobody will call the deleter.
    if capsule is not None and _capsule_is_valid(capsule, _LEGACY):
        _release_export(_capsule_raw_pointer(capsule, _LEGACY))


_capsule_new = ctypes.pythonapi["PyCapsule_New"]
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]


def export_device(array: DeviceArray, datatype: str) -> Any:
    """A legacy "dltensor" capsule of `array`'s GPU memory (kept alive until released)."""
    managed = _DLManagedTensor()
    shape = (ctypes.c_int64 * max(array.ndim, 1))(*array.shape)
    code, bits = _DATATYPE_TO_DLPACK[datatype]
    tensor = managed.dl_tensor
    tensor.data = array.pointer
    tensor.device = _DLDevice(_KDL_CUDA, array.device)
    tensor.ndim = array.ndim
    tensor.dtype = _DLDataType(code, bits, 1)
    tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    tensor.strides = None  # C order
    tensor.byte_offset = 0
    managed.deleter = _release_export
    address = ctypes.addressof(managed)
    _exports[address] = (managed, shape, array)
    return _capsule_new(address, _LEGACY, _destroy_capsule)


def _tensor_struct(capsule: Any) -> _DLTensor:
    name = _capsule_name(capsule)
    if name == _LEGACY:
        return _DLTensor.from_address(_capsule_pointer(capsule, _LEGACY))
    if name == _VERSIONED:
        address = _capsule_pointer(capsule, _VERSIONED) + _VERSIONED_TENSOR_OFFSET
        return _DLTensor.from_address(address)
    raise TritonModelException("DLPack capsule has already been consumed.")


def _check_device(device_type: int) -> None:
    if device_type in (_KDL_CPU, _KDL_CUDA_HOST):
        return
    if device_type == _KDL_CUDA:
        return
    raise TritonModelException(f"DLDevice type {device_type} is not support by Python backend.")


def _datatype(dtype: _DLDataType) -> str:
    if dtype.code == _KDL_BFLOAT and dtype.bits != 16:
        raise TritonModelException(f"Expected BF16 tensor to have 16 bits, but had: {dtype.bits}")
    datatype = _DLPACK_TO_DATATYPE.get((dtype.code, dtype.bits)) if dtype.lanes == 1 else None
    if datatype is None:
        raise TritonModelException("Dtype is invalid.")
    return datatype


def _check_contiguous(tensor: _DLTensor) -> bool:
    """Apply Triton's C-order check; True if only the first dimension is strided."""
    if not tensor.strides:
        return False
    ndim = tensor.ndim
    shape = [tensor.shape[i] for i in range(ndim)]
    strides = [tensor.strides[i] for i in range(ndim)]
    expected = 1
    # Innermost to outermost; size-1 dimensions may have any stride. Like Triton, the first
    # dimension's stride is not checked.
    for i in range(ndim - 1, 0, -1):
        if shape[i] != 1:
            if strides[i] != expected:
                raise TritonModelException(_NOT_CONTIGUOUS)
            expected *= shape[i]
    return ndim > 0 and shape[0] != 1 and strides[0] != expected
