"""Tensors across the process boundary: raw bytes through shared memory, never pickled lists.

A tensor travels as a small header (name, datatype, numpy dtype, shape) plus its data. Data of
`SHARED_MEMORY_MIN_BYTES` or more is written once into a file on /dev/shm (tmpfs, i.e. shared
memory) and read once by the other side, which unlinks it; smaller data rides inline in the
message as raw bytes, because creating a segment costs more than copying a few KiB. BYTES tensors
are object arrays of `bytes`; they cross as a list of `bytes`, which pickles as raw bytes too.

Every segment lives in one folder per instance (`SegmentFolder`), so whatever a crashed process
left behind is removed with the folder. GPU tensors cross device to device, through CUDA IPC
(gpu_tensors.py), with their markers in the same folder.

When shared memory is full (ENOSPC: Docker gives a container 64 MiB of /dev/shm unless told
`--shm-size`), a tensor rides inline in the message instead: slower (two more copies), but the
request is served. The first time, per folder, a warning says so and how to give more.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..pb_utils import Tensor
from . import gpu_tensors
from .gpu_tensors import CudaData, CudaExports

log = logging.getLogger(__name__)

SHARED_MEMORY_MIN_BYTES = 64 * 1024

_SHM_ROOT = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


@dataclass(frozen=True, slots=True)
class WireTensor:
    """A tensor in transit. `data` is raw bytes, a shared-memory file name, a bytes list, or
    a GPU tensor's IPC handle."""

    name: str
    datatype: str
    dtype: str
    shape: tuple[int, ...]
    data: bytes | str | list[bytes] | CudaData


class SegmentFolder:
    """The folder of one instance's shared-memory segments."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._warned_full = False
        self._cuda = CudaExports(path)

    @classmethod
    def create(cls, label: str) -> SegmentFolder:
        _remove_orphans()
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in label)[:60]
        path = _SHM_ROOT / f"dynamo-bridge-{os.getpid()}-{safe}-{uuid.uuid4().hex[:8]}"
        path.mkdir(mode=0o700)
        return cls(path)

    def remove(self) -> None:
        self._cuda.close()
        shutil.rmtree(self.path, ignore_errors=True)

    # -- encoding ----------------------------------------------------------------------------

    def pack(self, tensor: Tensor) -> WireTensor:
        self._cuda.release_received()
        device = tensor._device
        if device is not None:
            header = (tensor.name(), tensor._datatype, device.dtype.str, device.shape)
            return WireTensor(*header, self._cuda.export(device))
        array = tensor._wire_array()
        header = (tensor.name(), tensor._datatype, array.dtype.str, tuple(array.shape))
        if array.dtype.kind == "O":
            return WireTensor(*header, array.reshape(-1).tolist())
        if array.nbytes < SHARED_MEMORY_MIN_BYTES:
            return WireTensor(*header, array.tobytes())
        try:
            return WireTensor(*header, self._write_segment(array))
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            self._warn_full(exc, array.nbytes)
            return WireTensor(*header, array.tobytes())

    def _write_segment(self, array: np.ndarray) -> str:
        name = uuid.uuid4().hex
        path = self.path / name
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            view = memoryview(np.ascontiguousarray(array).data).cast("B")
            while view:
                view = view[os.write(fd, view) :]
        except BaseException:
            # A partly written segment still takes room in a full /dev/shm: give it back.
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        return name

    def _warn_full(self, exc: OSError, nbytes: int) -> None:
        if self._warned_full:
            return
        self._warned_full = True
        log.warning(
            "shared memory is full: could not write a %d-byte tensor under %s (%s); tensors "
            "that do not fit are sent inline over the instance's socket instead, which is "
            "slower. Give the server more shared memory (e.g. docker run --shm-size=1g).",
            nbytes,
            self.path.parent,
            exc.strerror,
        )

    def discard(self, wires: list[WireTensor]) -> None:
        """Remove the segments of `wires` that nobody will read (a message that did not go)."""
        for wire in wires:
            if isinstance(wire.data, CudaData):
                self._cuda.withdraw(wire.data)
            elif isinstance(wire.data, str):
                try:
                    os.unlink(self.path / wire.data)
                except OSError:
                    pass

    # -- decoding ----------------------------------------------------------------------------

    def unpack(self, wire: WireTensor) -> Tensor:
        """A writable tensor owning its data; a shared-memory segment is consumed (unlinked)."""
        self._cuda.release_received()
        dtype = np.dtype(wire.dtype)
        if isinstance(wire.data, CudaData):
            device = gpu_tensors.receive(self.path, wire.data, wire.shape, dtype)
            return Tensor._from_device(wire.name, device, wire.datatype)
        if isinstance(wire.data, list):
            array = np.empty(len(wire.data), dtype=object)
            array[:] = wire.data
        elif isinstance(wire.data, bytes):
            array = np.frombuffer(bytearray(wire.data), dtype=dtype)
        else:
            array = self._read_segment(wire.data, dtype, int(np.prod(wire.shape)))
        return Tensor._from_wire(wire.name, array.reshape(wire.shape), wire.datatype)

    def _read_segment(self, name: str, dtype: np.dtype, count: int) -> np.ndarray:
        path = self.path / name
        array = np.empty(count, dtype=dtype)
        fd = os.open(path, os.O_RDONLY)
        try:
            view = memoryview(array.data).cast("B")
            while view:
                read = os.readv(fd, [view])
                if read == 0:
                    raise OSError(f"shared-memory segment {name} is truncated")
                view = view[read:]
        finally:
            os.close(fd)
            os.unlink(path)
        return array


def pack_all(folder: SegmentFolder, tensors: list[Tensor]) -> list[WireTensor]:
    return [folder.pack(t) for t in tensors]


def unpack_all(folder: SegmentFolder, wires: list[WireTensor]) -> list[Tensor]:
    return [folder.unpack(w) for w in wires]


def _remove_orphans() -> None:
    """Remove the folders of bridge processes that died without cleaning up."""
    for path in _SHM_ROOT.glob("dynamo-bridge-*-*"):
        pid = path.name.split("-")[2]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
