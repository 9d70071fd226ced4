"""System shared memory, as Triton's gRPC server offers it to clients on the same host.

A client creates a POSIX shared memory object (`/dev/shm/<key>`), registers it under a name
(SystemSharedMemoryRegister: name, key, offset, byte_size), and then names it in an input's or a
requested output's parameters (`shared_memory_region`, `shared_memory_byte_size`,
`shared_memory_offset`) instead of sending the bytes. The door maps each registered object once;
an input is read from the mapping (one copy, into the bytes the request plane carries), an
output is written into it and its `raw_output_contents` entry is left empty, as Triton does.

Regions belong to the door process (as to a tritonserver process): with `--role frontend` the
client must share a host with the frontend, not with the workers. Texts and codes are Triton
2.51's [V]. CUDA shared memory is not supported (no GPU path): registering answers UNIMPLEMENTED.
"""

from __future__ import annotations

import errno
import mmap
import os
from dataclasses import dataclass

from model_repository_loader.pb_utils.errors import ErrorCode

from .status import DoorError

REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"
PARAMETERS = frozenset({REGION, BYTE_SIZE, OFFSET})


@dataclass
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    mapping: mmap.mmap


def _path(key: str) -> str:
    return os.path.join("/dev/shm", key.lstrip("/"))


class SharedMemory:
    """The system shared memory regions registered with this door."""

    def __init__(self) -> None:
        self.regions: dict[str, Region] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if name in self.regions:
            raise DoorError(
                ErrorCode.ALREADY_EXISTS, f"shared memory region '{name}' already in manager"
            )
        if any(region.key == key for region in self.regions.values()):
            # Triton maps an object once: a second region on the same key is refused [V].
            raise DoorError(ErrorCode.INTERNAL, f"Invalid shared memory region: '{key}'")
        try:
            fd = os.open(_path(key), os.O_RDWR)
        except OSError:
            raise DoorError(
                ErrorCode.INTERNAL, f"Unable to open shared memory region: '{key}'"
            ) from None
        failed = f"failed to register shared memory region '{name}': "
        try:
            # Triton's checks [V]: the region lies within the object, and, as Triton maps the
            # region itself, its offset is a multiple of the page size (EINVAL otherwise).
            if offset + byte_size > os.fstat(fd).st_size:
                raise DoorError(ErrorCode.INVALID_ARG, failed + "invalid args")
            if offset % mmap.ALLOCATIONGRANULARITY:
                raise DoorError(
                    ErrorCode.INVALID_ARG,
                    failed + "unable to process address space" + os.strerror(errno.EINVAL),
                )
            mapping = mmap.mmap(fd, offset + byte_size)
        except (OSError, ValueError) as exc:
            raise DoorError(
                ErrorCode.INTERNAL, f"unable to process address space for region '{key}': {exc}"
            ) from None
        finally:
            os.close(fd)
        self.regions[name] = Region(name, key, offset, byte_size, mapping)

    def unregister(self, name: str) -> None:
        """`name` empty: every region. An unknown name is no error (Triton's answer)."""
        names = list(self.regions) if not name else [name]
        for each in names:
            region = self.regions.pop(each, None)
            if region is not None:
                region.mapping.close()

    def status(self, name: str) -> list[Region]:
        if not name:
            return list(self.regions.values())
        region = self.regions.get(name)
        if region is None:
            raise DoorError(
                ErrorCode.NOT_FOUND, f"Unable to find system shared memory region: '{name}'"
            )
        return [region]

    def _span(self, name: str, offset: int, size: int) -> tuple[Region, int]:
        region = self.regions.get(name)
        if region is None:
            raise DoorError(ErrorCode.NOT_FOUND, f"Unable to find shared memory region: '{name}'")
        if offset < 0 or size < 0 or offset + size > region.byte_size:
            raise DoorError(
                ErrorCode.INVALID_ARG,
                f"Invalid offset + byte size for shared memory region: '{name}'",
            )
        return region, region.offset + offset

    def read(self, name: str, offset: int, size: int) -> bytes:
        region, start = self._span(name, offset, size)
        return region.mapping[start : start + size]

    def write(
        self, name: str, offset: int, size: int, output: str, data: bytes | bytearray
    ) -> None:
        region, start = self._span(name, offset, size)
        if len(data) > size:
            raise DoorError(
                ErrorCode.INTERNAL,
                f"shared memory size specified with the request for output '{output}' "
                f"({size} bytes) should be at least {len(data)} bytes to hold the results",
            )
        region.mapping[start : start + len(data)] = data

    def close(self) -> None:
        self.unregister("")


def placement(parameters: object) -> tuple[str, int, int] | None:
    """(region, offset, byte size) named by a tensor's parameters, or None."""
    region = parameters.get(REGION)  # type: ignore[attr-defined]
    if region is None:
        return None
    offset = parameters.get(OFFSET)  # type: ignore[attr-defined]
    size = parameters.get(BYTE_SIZE)  # type: ignore[attr-defined]
    return (
        region.string_param,
        offset.int64_param if offset is not None else 0,
        size.int64_param if size is not None else 0,
    )
