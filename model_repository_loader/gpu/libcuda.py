"""CUDA through the driver's own library, `libcuda.so.1`, with ctypes: the calls of
`cuda.CudaCalls` where cuda-bindings cannot be used.

That is an `EXECUTION_ENV_PATH` environment, whose Python has none of the server's packages
(Triton's stub is C++ and links CUDA itself, so a Triton model's environment never needed
them), and cuda-bindings newer than the driver (13.x on a CUDA 12 driver). The driver API is
the one every CUDA installation has, with stable symbols, so the same calls work under any
Python and any driver of CUDA 11 on.

The runtime API's meaning is kept where the loader relies on it: making a device current makes
its primary context current (`cudaSetDevice`), the one torch, cupy and jax use, retained once
per process; copies infer their direction from unified addresses (`cudaMemcpyDefault`).
"""

from __future__ import annotations

import ctypes
import threading
from ctypes import POINTER, byref, c_char_p, c_int, c_size_t, c_uint, c_uint64, c_void_p
from typing import Any

from .errors import CudaError, CudaUnavailable

LIBRARY = "libcuda.so.1"
IPC_HANDLE_BYTES = 64

# CUresult values (cuda.h)
_SUCCESS = 0
# No usable CUDA here (what cuInit documents for a broken install): not initialized, the stub
# library, no device, a driver that does not match the kernel module, a forward-compatibility
# package the device does not support.
_UNAVAILABLE = (3, 34, 100, 803, 804)
_LAZY_ENABLE_PEER_ACCESS = 1  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS


class _IpcHandle(ctypes.Structure):
    """CUipcMemHandle: 64 opaque bytes, passed by value to cuIpcOpenMemHandle."""

    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_BYTES)]


# name in the library → argument types (every function returns a CUresult). The `_v2` names
# are what cuda.h's unversioned names have meant since CUDA 4 (64-bit device pointers) and 11.
_SIGNATURES: dict[str, list[Any]] = {
    "cuInit": [c_uint],
    "cuDeviceGetCount": [POINTER(c_int)],
    "cuDeviceGet": [POINTER(c_int), c_int],
    "cuDevicePrimaryCtxRetain": [POINTER(c_void_p), c_int],
    "cuCtxGetCurrent": [POINTER(c_void_p)],
    "cuCtxSetCurrent": [c_void_p],
    "cuStreamSynchronize": [c_void_p],
    "cuMemcpyAsync": [c_uint64, c_uint64, c_size_t, c_void_p],
    "cuMemGetAddressRange_v2": [POINTER(c_uint64), POINTER(c_size_t), c_uint64],
    "cuMemAlloc_v2": [POINTER(c_uint64), c_size_t],
    "cuMemFree_v2": [c_uint64],
    "cuIpcGetMemHandle": [POINTER(_IpcHandle), c_uint64],
    "cuIpcOpenMemHandle_v2": [POINTER(c_uint64), _IpcHandle, c_uint],
    "cuIpcCloseMemHandle": [c_uint64],
    "cuGetErrorString": [c_int, POINTER(c_char_p)],
}


class LibCuda:
    """The calls of `cuda.CudaCalls` through `libcuda.so.1` (module doc); CudaUnavailable when
    the library cannot be loaded or initialised."""

    name = LIBRARY

    def __init__(self) -> None:
        try:
            library = ctypes.CDLL(LIBRARY)
        except OSError as exc:
            raise CudaUnavailable(f"the CUDA driver's {LIBRARY} cannot be loaded: {exc}") from None
        self._functions: dict[str, Any] = {}
        for name, arguments in _SIGNATURES.items():
            try:
                function = getattr(library, name)
            except AttributeError:
                raise CudaUnavailable(f"{LIBRARY} has no {name}: a driver too old") from None
            function.argtypes = arguments
            function.restype = c_int
            self._functions[name] = function
        self._primary: dict[int, int] = {}  # device → its primary context, retained once
        # Re-entrant: a finalizer freeing GPU memory may run inside the retain (an allocation
        # there can start a garbage collection) and make its device current on this thread.
        self._retaining = threading.RLock()
        self._call("cuInit", 0)

    def _call(self, name: str, *args: Any) -> None:
        result = self._functions[name](*args)
        if result == _SUCCESS:
            return
        text = c_char_p()
        known = self._functions["cuGetErrorString"](result, byref(text)) == _SUCCESS
        reason = text.value.decode() if known and text.value else f"CUresult {result}"
        message = f"{name} failed: {reason}"
        if result in _UNAVAILABLE:
            raise CudaUnavailable(message)
        raise CudaError(message)

    def device_count(self) -> int:
        count = c_int()
        self._call("cuDeviceGetCount", byref(count))
        return count.value

    def set_device(self, device: int) -> None:
        self.set_context(self.primary_context(device))

    def primary_context(self, device: int) -> int:
        with self._retaining:
            context = self._primary.get(device)
            if context is None:
                handle = c_int()
                self._call("cuDeviceGet", byref(handle), device)
                retained = c_void_p()
                self._call("cuDevicePrimaryCtxRetain", byref(retained), handle.value)
                context = self._primary[device] = int(retained.value or 0)
            return context

    def current_context(self) -> int:
        context = c_void_p()
        self._call("cuCtxGetCurrent", byref(context))
        return int(context.value or 0)

    def set_context(self, context: int) -> None:
        self._call("cuCtxSetCurrent", c_void_p(context or None))

    def synchronize(self, stream: int) -> None:
        self._call("cuStreamSynchronize", c_void_p(stream or None))

    def copy(self, destination: int, source: int, nbytes: int, stream: int) -> None:
        self._call("cuMemcpyAsync", destination, source, nbytes, c_void_p(stream or None))

    def allocation_size(self, pointer: int) -> int:
        base, size = c_uint64(), c_size_t()
        self._call("cuMemGetAddressRange_v2", byref(base), byref(size), pointer)
        return base.value + size.value - pointer

    def allocate(self, nbytes: int) -> int:
        pointer = c_uint64()
        self._call("cuMemAlloc_v2", byref(pointer), nbytes)
        return pointer.value

    def free(self, pointer: int) -> None:
        self._call("cuMemFree_v2", pointer)

    def ipc_handle(self, pointer: int) -> bytes:
        handle = _IpcHandle()
        self._call("cuIpcGetMemHandle", byref(handle), pointer)
        return ctypes.string_at(ctypes.addressof(handle), IPC_HANDLE_BYTES)

    def ipc_open(self, handle: bytes) -> int:
        opened = _IpcHandle()
        ctypes.memmove(ctypes.addressof(opened), handle, IPC_HANDLE_BYTES)
        pointer = c_uint64()
        self._call("cuIpcOpenMemHandle_v2", byref(pointer), opened, _LAZY_ENABLE_PEER_ACCESS)
        return pointer.value

    def ipc_close(self, pointer: int) -> None:
        self._call("cuIpcCloseMemHandle", pointer)
