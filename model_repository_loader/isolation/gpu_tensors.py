"""GPU tensors across the process boundary, through CUDA IPC: device to device, never the host.

A GPU tensor's memory may be a piece of its framework's cached pool (torch hands out slices of
larger blocks), and CUDA IPC exports whole allocations only; its owner may also free it as soon
as the message is sent. So the sender copies the tensor (device to device) into an allocation
of its own, exports that allocation's IPC handle, and keeps it until the receiver has copied it
into an allocation of the receiver's: two copies on the GPU, none through the host, and no
memory of one process that the other can read after its owner let it go. (Triton's stub stages
GPU tensors through its own CUDA memory pool the same way.)

The receiver says it is done by unlinking the tensor's marker file in the instance's segment
folder (the sender made it, O_EXCL), as it unlinks a host segment once read, so no message is
added to the instance protocol: the sender lets go of every allocation whose marker is gone
each time its side packs or unpacks another tensor, and of all of them when it closes.
The folder is the instance's, so a crashed process's markers go with it.
"""

from __future__ import annotations

import os
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..gpu import cuda
from ..gpu.device_array import DeviceArray

MARKER_PREFIX = "cuda-"


@dataclass(frozen=True, slots=True)
class CudaData:
    """Where a GPU tensor's bytes wait for the receiver: an IPC handle on `device`."""

    handle: bytes
    device: int
    nbytes: int
    marker: str  # file name in the segment folder; gone once the receiver has copied


class CudaExports:
    """One side's exported allocations, kept until the other side has copied them."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self._kept: dict[str, cuda.Allocation] = {}
        self._lock = threading.Lock()

    def export(self, array: DeviceArray) -> CudaData:
        self.release_received()
        allocation = cuda.Allocation(array.nbytes, array.device)
        with cuda.on_device(array.device):
            cuda.copy(allocation.pointer, array.pointer, array.nbytes)
            handle = cuda.ipc_handle(allocation.pointer)
        marker = MARKER_PREFIX + uuid.uuid4().hex
        os.close(os.open(self._folder / marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        with self._lock:
            self._kept[marker] = allocation
        return CudaData(handle, array.device, array.nbytes, marker)

    def release_received(self) -> None:
        """Let go of the allocations the other side has copied (their markers are gone)."""
        if not self._kept:  # the common case, on every tensor the folder packs or unpacks
            return
        with self._lock:
            done = [m for m in self._kept if not (self._folder / m).exists()]
            for marker in done:
                del self._kept[marker]

    def withdraw(self, data: CudaData) -> None:
        """An export whose message never went: nobody will copy it."""
        with self._lock:
            self._kept.pop(data.marker, None)
        _unlink(self._folder / data.marker)

    def close(self) -> None:
        with self._lock:
            self._kept.clear()


def receive(folder: Path, data: CudaData, shape: tuple[int, ...], dtype: np.dtype) -> DeviceArray:
    """The sender's tensor, copied into an allocation of this process on the same device."""
    try:
        mapping = cuda.IpcMapping(data.handle, data.device)
        allocation = cuda.Allocation(data.nbytes, data.device)
        with cuda.on_device(data.device):
            cuda.copy(allocation.pointer, mapping.pointer, data.nbytes)
        del mapping  # closed: the copy is done
    finally:
        _unlink(folder / data.marker)  # the sender may let its allocation go
    return DeviceArray(allocation.pointer, shape, dtype, data.device, allocation)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
