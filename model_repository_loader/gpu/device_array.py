"""`DeviceArray`: a tensor's memory on a GPU, as a GPU `pb_utils.Tensor` holds it.

C-ordered and contiguous (Triton's rule for DLPack), described by a pointer, a shape, a numpy
dtype (uint16 for BF16, as on the host) and a CUDA ordinal. `owner` is whatever keeps the memory
alive: a producer's DLPack tensor (whose deleter runs when the owner goes), an `Allocation` the
loader made, or a CUDA IPC mapping. Views made by `reshape` share the owner, so the memory lives
until the last tensor, view or exported DLPack capsule that reaches it is gone: a model that
keeps a reference never reads freed memory.

Nothing here copies implicitly except `to_host`, which the wires call where they need bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

# `cuda` is imported where it is used: its errors import pb_utils (they are pb_utils'
# exception types), whose Tensor imports this module, which may be the first one imported.


class DeviceArray:
    __slots__ = ("pointer", "shape", "dtype", "device", "owner")

    pointer: int
    shape: tuple[int, ...]
    dtype: np.dtype
    device: int
    owner: Any

    def __init__(
        self, pointer: int, shape: Sequence[int], dtype: np.dtype, device: int, owner: Any
    ) -> None:
        self.pointer = pointer
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.device = device
        self.owner = owner

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def reshape(self, shape: Sequence[int]) -> DeviceArray:
        """The same memory under another shape (ValueError when the sizes differ, as numpy)."""
        shape = [int(d) for d in shape]
        if int(np.prod(shape, dtype=np.int64)) != self.size:
            raise ValueError(f"cannot reshape array of size {self.size} into shape {shape}")
        return DeviceArray(self.pointer, shape, self.dtype, self.device, self.owner)

    def viewed_as(self, dtype: np.dtype, shape: Sequence[int]) -> DeviceArray:
        """The same bytes read as `dtype` in `shape` (ValueError when the sizes differ)."""
        shape = [int(d) for d in shape]
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if nbytes != self.nbytes:
            raise ValueError(f"{self.nbytes} bytes cannot be read as {dtype} in shape {shape}")
        return DeviceArray(self.pointer, shape, dtype, self.device, self.owner)

    def to_host(self) -> np.ndarray:
        """A host copy (a new, writable numpy array of the same shape and dtype)."""
        from . import cuda

        with cuda.on_device(self.device):
            raw = cuda.copy_to_host(self.pointer, self.nbytes)
        return raw.view(self.dtype).reshape(self.shape)

    @classmethod
    def from_host(cls, array: np.ndarray, device: int) -> DeviceArray:
        """A new device copy of a host array on `device`."""
        from . import cuda

        array = np.ascontiguousarray(array)
        allocation = cuda.Allocation(array.nbytes, device)
        with cuda.on_device(device):
            cuda.copy(allocation.pointer, array.ctypes.data, array.nbytes)
        return cls(allocation.pointer, array.shape, array.dtype, device, allocation)

    def copy_to(self, device: int) -> DeviceArray:
        """A new copy of this memory on `device` (another GPU, or the same one)."""
        from . import cuda

        allocation = cuda.Allocation(self.nbytes, device)
        with cuda.on_device(device):
            cuda.copy(allocation.pointer, self.pointer, self.nbytes)
        return DeviceArray(allocation.pointer, self.shape, self.dtype, device, allocation)

    def __repr__(self) -> str:
        return f"<DeviceArray cuda:{self.device} {self.dtype} {list(self.shape)}>"
