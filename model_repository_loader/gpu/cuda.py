"""The CUDA calls the loader makes, and which implementation makes them in this process.

Few and plain: make a device current, copy between host and device (or device and device),
allocate, wait for a stream, and CUDA IPC handles. Copies infer their direction from unified
addresses, on the legacy default stream, which is what Triton's stub synchronises with before
a tensor changes hands.

Two implementations of the same calls (`CudaCalls`), chosen once per process at the first call:
NVIDIA's `cuda-bindings` (bindings.py) where it can be imported and reaches the driver, else the
driver's own `libcuda.so.1` through ctypes (libcuda.py: an `EXECUTION_ENV_PATH` environment's
Python without the bindings, bindings newer than the driver). Where neither can be used (no
driver, no device) every call raises CudaUnavailable with both reasons, and nothing is loaded
until GPU memory is touched.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, Protocol

import numpy as np

from ..pb_utils.errors import TritonModelException
from .errors import CudaError, CudaUnavailable

log = logging.getLogger(__name__)

IPC_HANDLE_BYTES = 64
# cudaStreamLegacy / CU_STREAM_LEGACY: the legacy default stream, whatever the thread's default is.
LEGACY_STREAM = 1


class CudaCalls(Protocol):
    """What each implementation offers: the runtime API's meaning (libcuda.py's doc)."""

    name: str

    def device_count(self) -> int: ...
    def set_device(self, device: int) -> None: ...
    def primary_context(self, device: int) -> int: ...
    def current_context(self) -> int: ...
    def set_context(self, context: int) -> None: ...
    def synchronize(self, stream: int) -> None: ...
    def copy(self, destination: int, source: int, nbytes: int, stream: int) -> None: ...
    def allocation_size(self, pointer: int) -> int: ...
    def allocate(self, nbytes: int) -> int: ...
    def free(self, pointer: int) -> None: ...
    def ipc_handle(self, pointer: int) -> bytes: ...
    def ipc_open(self, handle: bytes) -> int: ...
    def ipc_close(self, pointer: int) -> None: ...


# This process's implementation, or why there is none: chosen once (a driver does not appear
# while a process runs, and a client registering CUDA regions on a CPU host must not make each
# attempt load libraries again).
_chosen: CudaCalls | CudaUnavailable | None = None
_choosing = threading.Lock()


def calls() -> CudaCalls:
    """This process's implementation (module doc); CudaUnavailable, with each one's reason,
    where neither can be used."""
    global _chosen
    chosen = _chosen
    if chosen is None:
        with _choosing:
            if _chosen is None:
                _chosen = _choose()
            chosen = _chosen
    if isinstance(chosen, CudaUnavailable):
        raise CudaUnavailable(str(chosen))
    return chosen


def _choose() -> CudaCalls | CudaUnavailable:
    from .bindings import Bindings
    from .libcuda import LibCuda

    reasons = []
    for implementation in (Bindings, LibCuda):
        try:
            candidate = implementation()
            candidate.device_count()  # reaches the driver
        except TritonModelException as exc:  # CudaUnavailable, or a CudaError
            reasons.append(f"{implementation.name}: {exc}")
            continue
        log.debug("CUDA calls through %s", candidate.name)
        return candidate
    return CudaUnavailable("CUDA cannot be used here (" + "; ".join(reasons) + ")")


def set_device(device: int) -> None:
    """Make `device` current on the calling thread (and its primary context, as the runtime
    and every framework that meets it through DLPack use)."""
    calls().set_device(device)


def device_count() -> int:
    """How many devices CUDA shows this process (CudaUnavailable where it cannot be used)."""
    return calls().device_count()


def require_device() -> None:
    """CudaUnavailable unless CUDA can be used here with at least one device."""
    if device_count() == 0:
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
    except CudaUnavailable as exc:  # a GPU host without a usable driver
        log.warning(
            "GPU instance on device %d cannot use CUDA (%s): the model runs, and GPU tensors in "
            "pb_utils fail here",
            device,
            exc,
        )
    except CudaError as exc:
        log.warning("could not make GPU %d current for an instance: %s", device, exc)


def current_context() -> int:
    """The CUDA context bound to the calling thread (0 when none is)."""
    return calls().current_context()


def synchronize(stream: int = LEGACY_STREAM) -> None:
    calls().synchronize(stream)


def copy(destination: int, source: int, nbytes: int) -> None:
    """Copy `nbytes` from `source` to `destination` (host or device addresses, any mix), done
    when this returns: a copy between two device addresses does not wait by itself, and the
    memory may be read next by another process (CUDA IPC) or another stream."""
    if nbytes:
        # On the legacy stream by name: a process whose default stream is per-thread
        # (CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM) would otherwise copy on another one.
        implementation = calls()
        implementation.copy(destination, source, nbytes, LEGACY_STREAM)
        implementation.synchronize(LEGACY_STREAM)


def allocation_bytes_from(pointer: int) -> int:
    """How many bytes of its allocation lie from `pointer` on (CudaError for an address that is
    in no allocation)."""
    return calls().allocation_size(pointer)


def copy_to_host(source: int, nbytes: int) -> np.ndarray:
    """A new host array of `nbytes` bytes (uint8) copied from device memory at `source`."""
    host = np.empty(nbytes, dtype=np.uint8)
    copy(host.ctypes.data, source, nbytes)
    return host


class Allocation:
    """`nbytes` of device memory allocated on `device`, freed when the last reference
    to it goes (a finalizer, so a view that outlives its maker keeps it)."""

    __slots__ = ("pointer", "nbytes", "device", "__weakref__")

    def __init__(self, nbytes: int, device: int) -> None:
        with on_device(device):
            pointer = calls().allocate(max(nbytes, 1))
        self.pointer = pointer
        self.nbytes = nbytes
        self.device = device
        # Not at exit: the driver frees a process's memory, and CUDA may be torn down first.
        weakref.finalize(self, _free, pointer, device).atexit = False


def _free(pointer: int, device: int) -> None:
    try:
        with on_device(device):
            calls().free(pointer)
    except TritonModelException:
        pass  # the process is going away with its context


class on_device:  # noqa: N801 - used as a context manager, like torch.cuda.device
    """Make `device`'s primary context current for a block, then give the thread back the
    context it had.

    The primary context (the one torch, cupy and the runtime use), even where another context
    of the same device is current (one a model made with PyCUDA, say): memory allocated in that
    one would go with it, and a CUDA IPC handle opens in one context per device only. The
    context given back, not the device number: on a thread that never used CUDA the runtime
    says device 0 with no context bound, and setting device 0 back would create device 0's
    primary context (hundreds of MiB on GPU 0) in a process whose work is on another GPU."""

    __slots__ = ("_device", "_saved")

    def __init__(self, device: int) -> None:
        self._device = device
        self._saved: int | None = None

    def __enter__(self) -> None:
        implementation = calls()
        saved = implementation.current_context()
        primary = implementation.primary_context(self._device)
        if saved != primary:
            implementation.set_context(primary)
            self._saved = saved

    def __exit__(self, *_: Any) -> None:
        if self._saved is not None:
            saved, self._saved = self._saved, None
            calls().set_context(saved)


# -- CUDA IPC ---------------------------------------------------------------------------------

_ipc_lock = threading.Lock()


def ipc_handle(pointer: int) -> bytes:
    """The 64-byte IPC handle of the allocation that starts at `pointer`."""
    return calls().ipc_handle(pointer)


class IpcMapping:
    """Another process's device memory, opened from its IPC handle on `device`, closed when the
    last reference goes. `pointer` is the mapped base (offsets are the caller's)."""

    __slots__ = ("pointer", "device", "__weakref__")

    def __init__(self, handle: bytes, device: int) -> None:
        if len(handle) != IPC_HANDLE_BYTES:
            raise CudaError(f"a CUDA IPC handle has {IPC_HANDLE_BYTES} bytes, not {len(handle)}")
        with _ipc_lock, on_device(device):
            pointer = calls().ipc_open(handle)
        self.pointer = pointer
        self.device = device
        weakref.finalize(self, _close, self.pointer, device).atexit = False


def _close(pointer: int, device: int) -> None:
    try:
        with on_device(device):
            calls().ipc_close(pointer)
    except TritonModelException:
        pass
