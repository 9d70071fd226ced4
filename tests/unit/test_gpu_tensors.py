"""GPU tensors in pb_utils, the parts that need no GPU: ownership, zero copy, the texts.

A producer here hands out DLPack capsules that say kDLCUDA (device 3) over a host buffer and
count their deleter's calls, as torch's and cupy's capsules would for device memory. Nothing in
these paths reads the memory, so the buffer's true home does not matter; what is checked is
that the pointer travels unchanged and that the producer's memory is released exactly once,
after its last holder. The paths that copy (the wire, FORCE_CPU_ONLY_INPUT_TENSORS) need CUDA:
tests/gpu covers them on a GPU host; here they must fail with a clear text.
"""

from __future__ import annotations

import ctypes
import gc

import numpy as np
import pytest

from model_repository_loader.composition.tensors import handed_over
from model_repository_loader.gpu import cuda
from model_repository_loader.pb_utils import Tensor, TritonModelException
from tests.harness.gpu import cuda_usable

_KDL_CUDA = 2
_DEVICE = 3


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


_new_capsule = ctypes.pythonapi["PyCapsule_New"]
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_pointer = ctypes.pythonapi["PyCapsule_GetPointer"]
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_set_name = ctypes.pythonapi["PyCapsule_SetName"]
_capsule_set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_name = ctypes.pythonapi["PyCapsule_GetName"]
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]


_LIVING: list[Producer] = []


class Producer:
    """Capsules over `buffer`'s memory labelled as CUDA device 3; `freed` counts deleter calls
    (a capsule consumed by the code under test must be released by it, exactly once)."""

    def __init__(self, shape: tuple[int, ...] = (2, 3)) -> None:
        self.buffer = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
        self.freed = 0
        self._kept: list[object] = []
        self._deleter = _DELETER(self._delete)
        _LIVING.append(self)  # a producer's library outlives the memory it hands out

    def _delete(self, _address: int | None) -> None:
        self.freed += 1

    def capsule(self) -> object:
        managed = _Managed()
        shape = (ctypes.c_int64 * self.buffer.ndim)(*self.buffer.shape)
        managed.dl_tensor.data = self.buffer.ctypes.data
        managed.dl_tensor.device = _Device(_KDL_CUDA, _DEVICE)
        managed.dl_tensor.ndim = self.buffer.ndim
        managed.dl_tensor.dtype = _DataType(2, 32, 1)  # float32
        managed.dl_tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        managed.deleter = self._deleter
        self._kept += [managed, shape]
        # No destructor: every capsule in these tests is consumed.
        return _new_capsule(ctypes.addressof(managed), b"dltensor", None)


def _struct(capsule: object) -> _Managed:
    return _Managed.from_address(_capsule_pointer(capsule, _capsule_name(capsule)))


def _collect() -> None:
    gc.collect()


def test_a_cuda_capsule_becomes_a_gpu_tensor_without_a_copy() -> None:
    producer = Producer()
    capsule = producer.capsule()
    tensor = Tensor.from_dlpack("OUT", capsule)
    assert not tensor.is_cpu()
    assert tensor.__dlpack_device__() == (_KDL_CUDA, _DEVICE)
    assert tensor.shape() == [2, 3]
    assert tensor.name() == "OUT"
    assert tensor._device is not None and tensor._device.pointer == producer.buffer.ctypes.data
    assert _capsule_name(capsule) == b"used_dltensor"  # consumed, as Triton renames it
    with pytest.raises(TritonModelException, match="DLPack capsule has already been consumed"):
        Tensor.from_dlpack("again", capsule)


def test_as_numpy_of_a_gpu_tensor_fails_with_tritons_text() -> None:
    tensor = Tensor.from_dlpack("OUT", Producer().capsule())
    with pytest.raises(TritonModelException) as info:
        tensor.as_numpy()
    assert str(info.value) == "Tensor is stored in GPU and cannot be converted to NumPy."


def test_to_dlpack_hands_on_the_same_memory() -> None:
    producer = Producer()
    tensor = Tensor.from_dlpack("OUT", producer.capsule())
    for exported in (tensor.to_dlpack(), tensor.__dlpack__(stream=7)):
        assert _capsule_name(exported) == b"dltensor"
        dl = _struct(exported).dl_tensor
        assert dl.data == producer.buffer.ctypes.data
        assert (dl.device.device_type, dl.device.device_id) == (_KDL_CUDA, _DEVICE)
        assert (dl.dtype.code, dl.dtype.bits, dl.dtype.lanes) == (2, 32, 1)
        assert [dl.shape[i] for i in range(dl.ndim)] == [2, 3]
        assert not dl.strides  # C order


def test_memory_outlives_the_tensor_while_an_unconsumed_capsule_holds_it() -> None:
    producer = Producer()
    tensor = Tensor.from_dlpack("OUT", producer.capsule())
    exported = tensor.to_dlpack()
    del tensor
    _collect()
    assert producer.freed == 0
    del exported  # dropped unconsumed: its destructor lets go
    _collect()
    assert producer.freed == 1


def test_a_consumer_holds_the_memory_until_it_calls_the_deleter() -> None:
    producer = Producer()
    tensor = Tensor.from_dlpack("OUT", producer.capsule())
    exported = tensor.to_dlpack()
    # A consumer (torch.from_dlpack) takes the capsule: renames it, keeps the struct.
    managed = _struct(exported)
    _capsule_set_name(exported, b"used_dltensor")
    del exported, tensor
    _collect()
    assert producer.freed == 0  # the consumer still reads it
    managed.deleter(ctypes.addressof(managed))  # the consumer's tensor goes
    _collect()
    assert producer.freed == 1


def test_renamed_reshaped_and_handed_over_tensors_share_the_memory() -> None:
    producer = Producer()
    tensor = Tensor.from_dlpack("OUT", producer.capsule())
    pointer = producer.buffer.ctypes.data
    renamed = handed_over(tensor, "IN")  # an ensemble step's input
    reshaped = tensor._reshaped([3, 2])
    assert handed_over(tensor) is tensor  # a BLS response's output, as it is
    for view, name, shape in ((renamed, "IN", [2, 3]), (reshaped, "OUT", [3, 2])):
        assert not view.is_cpu()
        assert (view.name(), view.shape()) == (name, shape)
        assert view._device is not None and view._device.pointer == pointer
    with pytest.raises(ValueError):
        tensor._reshaped([4])
    del tensor, renamed, view
    _collect()
    assert producer.freed == 0  # `reshaped` still holds it
    del reshaped
    _collect()
    assert producer.freed == 1


def test_bytes_cannot_be_exported_from_a_gpu_tensor_either() -> None:
    tensor = Tensor("S", np.array([b"a"], dtype=np.object_))
    with pytest.raises(TritonModelException, match="DLPack does not have support for string"):
        tensor.to_dlpack()


WITHOUT_CUDA = pytest.mark.skipif(cuda_usable(), reason="needs a host where CUDA cannot be used")


@WITHOUT_CUDA
def test_without_a_driver_the_host_copy_says_why() -> None:
    tensor = Tensor.from_dlpack("OUT", Producer().capsule())
    with pytest.raises(cuda.CudaUnavailable, match="cuda"):
        tensor._array  # what a wire would read  # noqa: B018


@WITHOUT_CUDA
def test_a_gpu_object_on_a_host_without_cuda_gets_tritons_text() -> None:
    gpu_tensor = Tensor.from_dlpack("OUT", Producer().capsule())
    # An object with __dlpack__ on CUDA (here our own GPU tensor): its stream must be waited for.
    with pytest.raises(TritonModelException) as info:
        Tensor.from_dlpack("IN", gpu_tensor)
    assert str(info.value).startswith(
        "DLPack capsule passed pointer to memory allocated on GPU device, when GPU is not available"
    )


@WITHOUT_CUDA
def test_without_a_driver_each_way_to_cuda_says_why() -> None:
    with pytest.raises(cuda.CudaUnavailable) as info:
        cuda.calls()
    text = str(info.value)
    assert text.startswith("CUDA cannot be used here (cuda-bindings: ")
    assert "; libcuda.so.1: the CUDA driver's libcuda.so.1 cannot be loaded: " in text
