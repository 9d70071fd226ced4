"""The CUDA runtime calls the loader makes, through NVIDIA's `cuda-bindings`.

Few and plain: make a device current, copy between host and device (or device and device),
allocate, wait for a stream, and CUDA IPC handles. Copies use `cudaMemcpyDefault` (unified
addressing tells the direction) on the legacy default stream, which is what Triton's stub
synchronises with before a tensor changes hands.

`cuda-bindings` 12.6+ names its module `cuda.bindings.runtime`; older `cuda-python` releases
name it `cuda.cudart`; both are accepted. Without either, or without a driver, every call
raises `CudaUnavailable` with the reason, and nothing is imported until GPU memory is touched.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
import threading
import weakref
from typing import Any

import numpy as np

from ..pb_utils.errors import TritonModelException

log = logging.getLogger(__name__)

IPC_HANDLE_BYTES = 64
# cudaStreamLegacy: the legacy default stream, whatever the thread's default is.
LEGACY_STREAM = 1


class CudaUnavailable(TritonModelException):
    """CUDA cannot be used in this process (no bindings, no driver, no device)."""


class CudaError(TritonModelException):
    """A CUDA call failed."""


@functools.cache
def runtime() -> Any:
    """The bindings' runtime module; raises CudaUnavailable when there is none."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart  # cuda-python before 12.6
        except ImportError:
            raise CudaUnavailable(
                "GPU memory needs NVIDIA's cuda-bindings package (pip install 'dynamo-bridge[gpu]')"
            ) from None
    return cudart


@functools.cache
def driver() -> Any:
    """The bindings' driver module (the thread's current context is the driver's to tell)."""
    runtime()  # CudaUnavailable first, with its text, when there are no bindings
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        from cuda import cuda as cu  # cuda-python before 12.6
    return cu


def bindings_installed() -> bool:
    """Whether the bindings can be imported (without importing them)."""
    try:
        return any(
            importlib.util.find_spec(name) is not None for name in ("cuda.bindings", "cuda.cudart")
        )
    except ModuleNotFoundError:  # no `cuda` package at all
        return False


def call(name: str, *args: Any) -> Any:
    """`cudart.<name>(*args)`; the one value it returns (or None); CudaError when it fails."""
    cudart = runtime()
    result = getattr(cudart, name)(*args)
    error = result[0]
    if error != cudart.cudaError_t.cudaSuccess:
        _, text = cudart.cudaGetErrorString(error)
        message = f"{name} failed: {text.decode() if isinstance(text, bytes) else text}"
        if error in _unavailable_errors(cudart):
            raise CudaUnavailable(message)
        raise CudaError(message)
    return result[1] if len(result) > 1 else None


def _unavailable_errors(cudart: Any) -> tuple[Any, ...]:
    codes = cudart.cudaError_t
    return (codes.cudaErrorInsufficientDriver, codes.cudaErrorNoDevice)


def set_device(device: int) -> None:
    """Make `device` current on the calling thread (and its primary context, as the runtime
    and every framework that meets it through DLPack use)."""
    call("cudaSetDevice", device)


def require_device() -> None:
    """CudaUnavailable unless CUDA can be used here with at least one device."""
    if int(call("cudaGetDeviceCount")) == 0:
        raise CudaUnavailable("no CUDA device")


def use_instance_device(kind: str, device: int) -> None:
    """Make a GPU instance's device current on the calling thread, so that a model's
    `torch.device("cuda")` or `cupy.cuda.Device()` is its own GPU. Triton's stub leaves
    device 0 current, and models had to read `model_instance_device_id` themselves; both
    ways work here. A host where CUDA cannot be used changes nothing."""
    if kind != "GPU":
        return
    try:
        set_device(device)
    except CudaUnavailable as exc:  # e.g. an EXECUTION_ENV_PATH environment without the bindings
        log.warning(
            "GPU instance on device %d cannot use CUDA (%s): the model runs, and GPU tensors in "
            "pb_utils fail here",
            device,
            exc,
        )
    except CudaError as exc:
        log.warning("could not make GPU %d current for an instance: %s", device, exc)


def current_device() -> int:
    return int(call("cudaGetDevice"))


def synchronize(stream: int = LEGACY_STREAM) -> None:
    call("cudaStreamSynchronize", stream)


def copy(destination: int, source: int, nbytes: int) -> None:
    """Copy `nbytes` from `source` to `destination` (host or device addresses, any mix), done
    when this returns: cudaMemcpy does not wait for a copy between two device addresses, and
    the memory may be read next by another process (CUDA IPC) or another stream."""
    if nbytes:
        call("cudaMemcpy", destination, source, nbytes, runtime().cudaMemcpyKind.cudaMemcpyDefault)
        synchronize()


def copy_to_host(source: int, nbytes: int) -> np.ndarray:
    """A new host array of `nbytes` bytes (uint8) copied from device memory at `source`."""
    host = np.empty(nbytes, dtype=np.uint8)
    copy(host.ctypes.data, source, nbytes)
    return host


class Allocation:
    """`nbytes` of device memory from `cudaMalloc` on `device`, freed when the last reference
    to it goes (a finalizer, so a view that outlives its maker keeps it)."""

    __slots__ = ("pointer", "nbytes", "device", "__weakref__")

    def __init__(self, nbytes: int, device: int) -> None:
        with on_device(device):
            pointer = int(call("cudaMalloc", max(nbytes, 1)))
        self.pointer = pointer
        self.nbytes = nbytes
        self.device = device
        # Not at exit: the driver frees a process's memory, and CUDA may be torn down first.
        weakref.finalize(self, _free, pointer, device).atexit = False


def _free(pointer: int, device: int) -> None:
    try:
        with on_device(device):
            call("cudaFree", pointer)
    except TritonModelException:
        pass  # the process is going away with its context


def _current_context() -> Any:
    """The CUDA context bound to the calling thread (a NULL one when none is)."""
    cu = driver()
    error, context = cu.cuCtxGetCurrent()
    if error != cu.CUresult.CUDA_SUCCESS:
        raise CudaError(f"cuCtxGetCurrent failed: {error}")
    return context


class on_device:  # noqa: N801 - used as a context manager, like torch.cuda.device
    """Make `device` current for a block, then give the thread back the context it had.

    The context, not the device number: on a thread that never used CUDA `cudaGetDevice` says
    0 with no context bound, and setting device 0 back would create device 0's primary context
    (hundreds of MiB on GPU 0) in a process whose work is on another GPU."""

    __slots__ = ("_device", "_saved")

    def __init__(self, device: int) -> None:
        self._device = device
        self._saved: Any = None

    def __enter__(self) -> None:
        current = current_device()  # initialises CUDA in this process if nothing has yet
        saved = _current_context()
        if current != self._device or not int(saved):
            set_device(self._device)
            self._saved = saved

    def __exit__(self, *_: Any) -> None:
        if self._saved is not None:
            cu = driver()
            (error,) = cu.cuCtxSetCurrent(self._saved)
            self._saved = None
            if error != cu.CUresult.CUDA_SUCCESS:
                raise CudaError(f"cuCtxSetCurrent failed: {error}")


# -- CUDA IPC ---------------------------------------------------------------------------------

_ipc_lock = threading.Lock()


def ipc_handle(pointer: int) -> bytes:
    """The 64-byte IPC handle of the allocation that starts at `pointer`."""
    handle = call("cudaIpcGetMemHandle", pointer)
    return ctypes.string_at(handle.getPtr(), IPC_HANDLE_BYTES)


class IpcMapping:
    """Another process's device memory, opened from its IPC handle on `device`, closed when the
    last reference goes. `pointer` is the mapped base (offsets are the caller's)."""

    __slots__ = ("pointer", "device", "__weakref__")

    def __init__(self, handle: bytes, device: int) -> None:
        if len(handle) != IPC_HANDLE_BYTES:
            raise CudaError(f"a CUDA IPC handle has {IPC_HANDLE_BYTES} bytes, not {len(handle)}")
        cudart = runtime()
        raw = ctypes.create_string_buffer(handle, IPC_HANDLE_BYTES)
        with _ipc_lock, on_device(device):
            pointer = call(
                "cudaIpcOpenMemHandle",
                cudart.cudaIpcMemHandle_t(_ptr=ctypes.addressof(raw)),
                cudart.cudaIpcMemLazyEnablePeerAccess,
            )
        self.pointer = int(pointer)
        self.device = device
        weakref.finalize(self, _close, self.pointer, device).atexit = False


def _close(pointer: int, device: int) -> None:
    try:
        with on_device(device):
            call("cudaIpcCloseMemHandle", pointer)
    except TritonModelException:
        pass
