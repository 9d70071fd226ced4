"""CUDA through NVIDIA's `cuda-bindings`: the runtime API for devices, memory, streams and IPC;
the driver API for the calling thread's context, which only the driver can tell.

`cuda-bindings` 12.6+ names its modules `cuda.bindings.runtime` and `cuda.bindings.driver`;
older `cuda-python` releases name them `cuda.cudart` and `cuda.cuda`; both are accepted.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from .errors import CudaError, CudaUnavailable

IPC_HANDLE_BYTES = 64


class Bindings:
    """The calls of `cuda.CudaCalls` through cuda-bindings; CudaUnavailable when it cannot be
    imported."""

    name = "cuda-bindings"

    def __init__(self) -> None:
        try:
            from cuda.bindings import driver, runtime
        except ImportError:
            try:
                from cuda import cuda as driver  # cuda-python before 12.6
                from cuda import cudart as runtime
            except ImportError:
                raise CudaUnavailable("NVIDIA's cuda-bindings package is not installed") from None
        self._runtime: Any = runtime
        self._driver: Any = driver
        codes = runtime.cudaError_t
        # No usable CUDA here: libcuda.py's list, and a driver older than the bindings.
        self._unavailable = tuple(
            getattr(codes, name)
            for name in (
                "cudaErrorInitializationError",
                "cudaErrorStubLibrary",
                "cudaErrorNoDevice",
                "cudaErrorSystemDriverMismatch",
                "cudaErrorCompatNotSupportedOnDevice",
                "cudaErrorInsufficientDriver",
            )
            if hasattr(codes, name)
        )
        self._primary: dict[int, int] = {}  # device → its primary context, retained once
        self._retaining = threading.RLock()  # re-entrant: libcuda.py says why

    def _call(self, name: str, *args: Any) -> Any:
        """`runtime.<name>(*args)`: the one value it returns (or None); CudaError when it fails."""
        runtime = self._runtime
        result = getattr(runtime, name)(*args)
        error = result[0]
        if error != runtime.cudaError_t.cudaSuccess:
            _, text = runtime.cudaGetErrorString(error)
            message = f"{name} failed: {text.decode() if isinstance(text, bytes) else text}"
            if error in self._unavailable:
                raise CudaUnavailable(message)
            raise CudaError(message)
        return result[1] if len(result) > 1 else None

    def _driver_call(self, name: str, *args: Any) -> Any:
        """`driver.<name>(*args)`: the value it returns, or the values as a tuple when it
        returns several; CudaError when it fails."""
        driver = self._driver
        result = getattr(driver, name)(*args)
        if result[0] != driver.CUresult.CUDA_SUCCESS:
            raise CudaError(f"{name} failed: {result[0]}")
        return result[1] if len(result) == 2 else result[1:] if len(result) > 2 else None

    def device_count(self) -> int:
        return int(self._call("cudaGetDeviceCount"))

    def set_device(self, device: int) -> None:
        self._call("cudaSetDevice", device)

    def primary_context(self, device: int) -> int:
        with self._retaining:
            context = self._primary.get(device)
            if context is None:
                handle = self._driver_call("cuDeviceGet", device)
                retained = self._driver_call("cuDevicePrimaryCtxRetain", handle)
                context = self._primary[device] = int(retained)
            return context

    def current_context(self) -> int:
        return int(self._driver_call("cuCtxGetCurrent"))

    def set_context(self, context: int) -> None:
        self._driver_call("cuCtxSetCurrent", self._driver.CUcontext(context))

    def synchronize(self, stream: int) -> None:
        self._call("cudaStreamSynchronize", stream)

    def copy(self, destination: int, source: int, nbytes: int, stream: int) -> None:
        kind = self._runtime.cudaMemcpyKind.cudaMemcpyDefault
        self._call("cudaMemcpyAsync", destination, source, nbytes, kind, stream)

    def allocation_size(self, pointer: int) -> int:
        base, size = self._driver_call("cuMemGetAddressRange", pointer)
        return int(base) + int(size) - pointer

    def allocate(self, nbytes: int) -> int:
        return int(self._call("cudaMalloc", nbytes))

    def free(self, pointer: int) -> None:
        self._call("cudaFree", pointer)

    def ipc_handle(self, pointer: int) -> bytes:
        handle = self._call("cudaIpcGetMemHandle", pointer)
        return ctypes.string_at(handle.getPtr(), IPC_HANDLE_BYTES)

    def ipc_open(self, handle: bytes) -> int:
        runtime = self._runtime
        raw = ctypes.create_string_buffer(handle, IPC_HANDLE_BYTES)
        opened = runtime.cudaIpcMemHandle_t(_ptr=ctypes.addressof(raw))
        flags = runtime.cudaIpcMemLazyEnablePeerAccess
        return int(self._call("cudaIpcOpenMemHandle", opened, flags))

    def ipc_close(self, pointer: int) -> None:
        self._call("cudaIpcCloseMemHandle", pointer)
