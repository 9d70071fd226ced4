"""System shared memory, as Triton's gRPC server offers it to clients on the same host.

A client creates a POSIX shared memory object (`/dev/shm/<key>`), registers it under a name
(SystemSharedMemoryRegister: name, key, offset, byte_size), and then names it in an input's or a
requested output's parameters (`shared_memory_region`, `shared_memory_byte_size`,
`shared_memory_offset`) instead of sending the bytes. An input is read from the object (one
copy, into the bytes the request plane carries; none for the door's own workers, below), an
output is written into it and its `raw_output_contents` entry is left empty, as Triton does.

A key is what `shm_open` sees, never a path: Triton passes it to glibc's `shm_open`, which skips
the leading slashes, refuses a name with any other `/` (EINVAL) and opens `/dev/shm/<name>` with
O_NOFOLLOW. The door does the same by hand (`object_name`, `open_object`): one name under the
`/dev/shm` directory's descriptor, no `.`/`..`, no NUL, at most NAME_MAX bytes, no symlink, and
only a regular file on `/dev/shm`'s own file system (our isolated instances' segment folders are
directories there, so no key reaches them). Anything else is Triton's INTERNAL "Unable to open
shared memory region". Keys that Triton ≥ 2.61 refuses before opening (`ValidateSharedMemoryKey`
in its src/common.cc: only slashes, or its python backend's reserved prefix) get its
INVALID_ARG texts; the 2.5x oracle still opened those.

The bridge's own regions are the bridge's as Triton's stub regions are Triton's (issue 38): the
door's pooled regions carry one client's inputs after another's, and a request's own regions
its inputs and answers, so a client that registered one would read and write other clients'
tensors. Their prefix (`dynbridge-`, bridge/transport/shm_regions.py) is refused as Triton's
reserved prefix is, with its text; and an object that is one of the door's own regions under
another name (a hard link: only a local user of the server's uid can make one) is refused
once opened, by its (st_dev, st_ino) (`bridge_made`, the door's ShmDoor.made).

The object's size may change after registration (a client may truncate it). Triton maps the
region and a truncated object then kills it with SIGBUS [V: the oracle dies on the next input
read]. The door maps no object a foreign uid owns: it keeps the object's descriptor and copies
with `pread`/`pwrite`, so a region past the object's current end is Triton's INVALID_ARG
"Invalid offset + byte size" and never a signal (for a mapped object too, when the object was
truncated before the request: its size is checked each time it is mapped).

Zero copies with the door's own workers (issue 27), for spans of LEND_MIN_BYTES or more:

* An input on an object owned by the door's own effective uid is mapped, per request, and lent
  to an in-process worker (the embedded default) as a private (copy-on-write) mapping that
  `execute` gets as its numpy array: writable, as Triton's inputs are, and what the model writes
  stays its own (Triton's stub hands it a copy). Such a client could already kill the door (same
  uid), so truncating a mapped object is no new power; an object of another uid is copied.
  A mapping is its own reference to the object, so unregistering the region while a request
  uses it changes nothing for the request, and it lives as long as something refers to it
  (Python's mmap unmaps on its last reference): a model that keeps an input past its request
  keeps valid memory, which then shows what the client writes into its region later (Triton's
  copy would not; kept inputs are rare, and copying every input to guard against them is the
  cost this path removes).
* An output is written by the worker, on the model's thread when the model sends it, with
  `pwrite` from the model's own array (`RegionWriter`): the one copy Triton's stub makes into
  its own memory, straight into the client's, with no `bytes` between. `pwrite` is safe on
  any object, so this is not limited to our uid. A shared mapping was tried and dropped: its
  write faults cost more than the copy they save (4 MiB: 2.3 ms against 2.1 ms).

Request-plane routes get bytes, never a mapping nor a writer (service.py).

Regions belong to the door process (as to a tritonserver process): with `--role frontend` the
client must share a host with the frontend, not with the workers. They are registered and
unregistered on the door's event loop, and a request holds the regions it names until its
answer is written (`holding`). Copies run off the loop (a large request's conversion, a large
answer's rendering, on either wire), some before their request holds anything, so each copy
finds its region and duplicates the descriptor in one hold of a lock under which the loop
closes descriptors, then copies through the duplicate without the lock: an unregistering never
waits for a copy, and a copy never reaches a descriptor closed and reused for another file.
Texts and codes are Triton 2.51's [V] unless said otherwise.

CUDA shared memory (a client's device memory, registered by its CUDA IPC handle, device id and
size) lives in the same name space as the system regions, as in Triton: `register_cuda` opens
the handle in this process (model_repository_loader/gpu/cuda.py), an input named there is
copied from the device, an output copied to it, with the same size checks and texts. For this
process's own model, an input is copied on the device instead when the model takes GPU inputs
(FORCE_CPU_ONLY_INPUT_TENSORS "no"), and reaches `execute` as a GPU tensor with no host copy;
an output is written when the model sends it, from the GPU when it is on one. A region
holds its mapping by reference: a request that copies from or to it keeps it open, so an
unregistering meanwhile closes it after the copy. Where CUDA cannot be used (no GPU, no
driver) `register_cuda` raises CudaUnavailable and each wire answers as
Triton does on a host without GPUs.

How many regions, system and CUDA together, one door holds is capped (`max_regions`,
`--max-shm-regions`; Triton has no cap): each system region on an object of its own keeps a
descriptor open, and each CUDA region a device mapping, so without a cap a client could take the
descriptors that connections and the request plane need, one registration at a time. Past the
cap a registration is UNAVAILABLE (HTTP 503, gRPC UNAVAILABLE; Triton's code for what frees
itself later, as a full queue is) until a region is unregistered; a region unregistered while in
use counts until its last request ends, since until then it holds its descriptor.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import stat
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from model_repository_loader.gpu import cuda
from model_repository_loader.gpu.device_array import DeviceArray
from model_repository_loader.model import cpu_only_input_tensors
from model_repository_loader.pb_utils.errors import ErrorCode

from ...transport import shm_regions
from ...transport.shm_regions import Identity
from .door_error import DoorError

log = logging.getLogger(__name__)

REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"
PARAMETERS = frozenset({REGION, BYTE_SIZE, OFFSET})

SHM_DIRECTORY = "/dev/shm"
# Triton's kTritonSharedMemoryRegionPrefix (src/common.h, refused since 2.60): its python
# backend's own regions, which a client must not map.
RESERVED_PREFIX = "triton_python_backend_shm_region_"
# Refused alike: the prefix of the regions between the bridge's door and its workers.
RESERVED_PREFIXES = (RESERVED_PREFIX, shm_regions.PREFIX)
NAME_MAX = 255  # Linux's, in bytes: a longer name is ENAMETOOLONG for shm_open too
# Spans lent to the door's own worker from this size on; smaller ones are copied, which costs
# less than a mapping's system calls and page faults (measured on 2 vCPUs: a 256 KiB span cost
# the same either way, 1 MiB 0.23 ms mapped against 0.61 ms copied; 16 B 69 µs against 13).
LEND_MIN_BYTES = 1 << 19
# O_NONBLOCK: a FIFO put there between the type check and the open must not hold the loop.
_OPEN_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


# The most regions (system and CUDA together) a door holds by default: far more than clients
# register in practice (perf_analyzer registers a few per input and output), and well inside
# the open-file limit the server raises at start (bridge/tuning.py).
DEFAULT_MAX_REGIONS = 1024

# What `holding` returns while no region is registered.
_NOTHING_HELD = contextlib.nullcontext()


@dataclass
class SharedObject:
    """One open shared memory object, shared by the regions on it.

    One descriptor per object, not per region: the same object under many keys ("/a", "//a",
    ...) must not cost a descriptor each, or registrations alone could use up the process's.
    """

    fd: int
    identity: Identity
    regions: int = 0


@dataclass
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    object: SharedObject  # kept open for the region's life (pread/pwrite, fstat)
    users: int = 0  # requests that name it and are not over (`holding`)
    unregistered: bool = False  # unregistered while in use: it goes when its last user ends


def validate_key(name: str, key: str) -> None:
    """Triton's ValidateSharedMemoryKey (src/common.cc, Triton ≥ 2.61): the checks made before
    the object is opened."""
    stripped = key.lstrip("/")
    if not stripped:
        raise DoorError(
            ErrorCode.INVALID_ARG,
            f"cannot register shared memory region '{name}' - invalid shm key '{key}'",
        )
    for prefix in RESERVED_PREFIXES:
        if stripped.startswith(prefix):
            raise DoorError(
                ErrorCode.INVALID_ARG,
                f"cannot register shared memory region '{name}' with key '{key}' as the key "
                f"contains the reserved prefix '{prefix}'",
            )


def object_name(key: str) -> bytes | None:
    """The name `shm_open(key)` opens in /dev/shm, or None where it refuses the key."""
    try:
        name = key.lstrip("/").encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (JSON's "\ud800") names no file
        return None
    if not name or b"/" in name or b"\0" in name or name in (b".", b".."):
        return None
    if len(name) > NAME_MAX:
        return None
    return name


def _unable_to_open(key: str) -> DoorError:
    return DoorError(ErrorCode.INTERNAL, f"Unable to open shared memory region: '{key}'")


def open_object(key: str, directory: str = SHM_DIRECTORY) -> int:
    """A read-write descriptor of the shared memory object `key` names, as shm_open opens it:
    one entry of `directory`, never through a symlink, and only a regular file of
    `directory`'s own file system."""
    name = object_name(key)
    if name is None:
        raise _unable_to_open(key)
    try:
        directory_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        raise _unable_to_open(key) from None
    try:
        # Nothing but a regular file is opened at all (opening a device can act); the fstat
        # below checks the file actually opened.
        if not stat.S_ISREG(os.stat(name, dir_fd=directory_fd, follow_symlinks=False).st_mode):
            raise _unable_to_open(key)
        fd = os.open(name, _OPEN_FLAGS, dir_fd=directory_fd)
    except OSError:
        raise _unable_to_open(key) from None
    else:
        found = os.fstat(fd)
        # A file mounted there from another file system is no shared memory object.
        if not stat.S_ISREG(found.st_mode) or found.st_dev != os.fstat(directory_fd).st_dev:
            os.close(fd)
            raise _unable_to_open(key)
        return fd
    finally:
        os.close(directory_fd)


@dataclass
class CudaRegion:
    name: str
    device_id: int
    byte_size: int
    mapping: cuda.IpcMapping  # the client's memory, open in this process


def made_by_nobody(identity: Identity) -> bool:
    """No region is the door's own (a door with no regions of its own, and tests)."""
    return False


# Triton 2.70 on (kClientShmDisabledErrorStr): registering and unregistering client regions,
# system or CUDA, is UNSUPPORTED unless the server was started with --allow-client-shm=true.
CLIENT_SHM_DISABLED = (
    "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
)


class SharedMemory:
    """The system shared memory regions registered with this door."""

    def __init__(
        self,
        directory: str = SHM_DIRECTORY,
        bridge_made: Callable[[Identity], bool] = made_by_nobody,
        allowed: bool = True,
        max_regions: int = DEFAULT_MAX_REGIONS,
    ) -> None:
        # --allow-client-shm: without it no region can be registered (status still answers).
        self.allowed = allowed
        # --max-shm-regions: what registrations may hold open (module doc).
        self.max_regions = max_regions
        self.regions: dict[str, Region] = {}
        self.cuda_regions: dict[str, CudaRegion] = {}
        self.directory = directory
        # Is an object one of the door's own regions (module doc)? The door's ShmDoor.made.
        self._bridge_made = bridge_made
        self._objects: dict[Identity, SharedObject] = {}
        # A region's descriptor is closed under this lock, and found and duplicated (or mapped)
        # under it: requests read and write regions on threads while the loop unregisters
        # them, and a descriptor closed and reused meanwhile would reach another file.
        self._descriptors = threading.Lock()

    def any_registered(self) -> bool:
        """Whether any region, system or CUDA, is registered (a request may name one)."""
        return bool(self.regions or self.cuda_regions)

    def require_allowed(self) -> None:
        """Triton's refusal of every (un)registration while client shared memory is off; the
        first check, before the request's own (the HTTP wire calls it before reading a body)."""
        if not self.allowed:
            raise DoorError(ErrorCode.UNSUPPORTED, CLIENT_SHM_DISABLED)

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.require_allowed()
        validate_key(name, key)  # before the name's check, as Triton ≥ 2.61 orders them
        self._check_new(name)
        if any(region.key == key for region in self.regions.values()):
            # Triton maps an object once: a second region on the same key is refused [V].
            raise DoorError(ErrorCode.INTERNAL, f"Invalid shared memory region: '{key}'")
        self._check_room(name)  # before the object is opened: no descriptor past the cap
        fd = open_object(key, self.directory)
        failed = f"failed to register shared memory region '{name}': "
        try:
            found = os.fstat(fd)
            identity = shm_regions.identity(found)
            if self._bridge_made(identity):
                raise DoorError(
                    ErrorCode.INVALID_ARG,
                    f"cannot register shared memory region '{name}' with key '{key}' as the "
                    "key names a shared memory region of the server",
                )
            # Triton's checks [V]: the region lies within the object; then its mmap refuses
            # (EINVAL) an offset that is no multiple of the page size, and an empty region.
            if offset + byte_size > found.st_size:
                raise DoorError(ErrorCode.INVALID_ARG, failed + "invalid args")
            if offset % mmap.ALLOCATIONGRANULARITY or byte_size == 0:
                raise DoorError(
                    ErrorCode.INVALID_ARG,
                    failed + "unable to process address space" + os.strerror(errno.EINVAL),
                )
        except BaseException:
            os.close(fd)
            raise
        shared = self._objects.get(identity)
        if shared is None:
            shared = self._objects[identity] = SharedObject(fd, identity)
        else:
            os.close(fd)
        shared.regions += 1
        self.regions[name] = Region(name, key, offset, byte_size, shared)

    def _check_new(self, name: str) -> None:
        if name in self.regions or name in self.cuda_regions:
            raise DoorError(
                ErrorCode.ALREADY_EXISTS, f"shared memory region '{name}' already in manager"
            )

    def _check_room(self, name: str) -> None:
        """Refuse a new region once the door holds `max_regions` (module doc); after the
        request's own checks, so a client still learns what is wrong with its request."""
        if len(self.regions) + len(self.cuda_regions) >= self.max_regions:
            raise DoorError(
                ErrorCode.UNAVAILABLE,
                f"failed to register shared memory region '{name}': the server holds "
                f"{self.max_regions} shared memory regions, its limit (--max-shm-regions); "
                "unregister one first",
            )

    def register_cuda(self, name: str, handle: bytes, device_id: int, byte_size: int) -> None:
        """A client's device memory under `name`. CudaUnavailable where CUDA cannot be used
        (before anything else is checked: the wires then answer as Triton without GPUs).

        As Triton: a handle that does not open, or memory smaller than `byte_size` from the
        handle's address on, is INVALID_ARG "invalid args", the reason only in the log. So is
        a device this process does not have (Triton tries the handle on its current device)."""
        self.require_allowed()
        devices = cuda.device_count()
        if not devices:
            raise cuda.CudaUnavailable("no CUDA device")
        self._check_new(name)
        self._check_room(name)
        invalid = DoorError(
            ErrorCode.INVALID_ARG, f"failed to register shared memory region '{name}': invalid args"
        )
        if len(handle) != cuda.IPC_HANDLE_BYTES or not 0 <= device_id < devices:
            raise invalid
        try:
            mapping = cuda.IpcMapping(handle, device_id)
        except cuda.CudaError as exc:  # CudaUnavailable goes on to the wire
            log.info("failed to open CUDA IPC handle: %s", exc)
            raise DoorError(
                ErrorCode.INVALID_ARG, "failed to register shared memory region: invalid args"
            ) from None
        try:
            with cuda.on_device(device_id):
                room = cuda.allocation_bytes_from(mapping.pointer)
        except cuda.CudaError as exc:
            log.info("CUDA shared memory region '%s': its size cannot be read: %s", name, exc)
            room = -1
        if byte_size > room:  # a copy past the allocation's end could break this process's CUDA
            raise invalid
        self.cuda_regions[name] = CudaRegion(name, device_id, byte_size, mapping)

    def cuda_status(self, name: str) -> list[CudaRegion]:
        if not name:
            return list(self.cuda_regions.values())
        region = self.cuda_regions.get(name)
        if region is None:
            raise DoorError(
                ErrorCode.NOT_FOUND, f"Unable to find cuda shared memory region: '{name}'"
            )
        return [region]

    def unregister_cuda(self, name: str) -> None:
        """`name` empty: every CUDA region; an unknown name is no error. A copy in flight keeps
        its region's mapping until it is done (the mapping closes with its last reference)."""
        self.require_allowed()
        if not name:
            self.cuda_regions.clear()
        else:
            self.cuda_regions.pop(name, None)

    def _cuda_span(self, name: str, offset: int, size: int) -> tuple[CudaRegion, int] | None:
        region = self.cuda_regions.get(name)
        if region is None:
            return None
        if offset < 0 or size < 0 or offset + size > region.byte_size:
            raise _past_end(name)
        return region, region.mapping.pointer + offset

    def unregister(self, name: str) -> None:
        """`name` empty: every region. An unknown name is no error (Triton's answer).

        A region that a request in flight names goes once the last such request ends; until
        then it is still listed and usable, as Triton ≥ 2.53 defers it ("will be unregistered
        after in-flight requests complete"; 2.51 refused with "it is currently in use"). Its
        output is then still written there, and its descriptor never closes under a copy."""
        self.require_allowed()
        names = list(self.regions) if not name else [name]
        for each in names:
            region = self.regions.get(each)
            if region is None:
                continue
            if region.users:
                region.unregistered = True
                continue
            self._remove(region)

    def _remove(self, region: Region) -> None:
        del self.regions[region.name]
        region.object.regions -= 1
        if not region.object.regions:
            del self._objects[region.object.identity]
            with self._descriptors:
                os.close(region.object.fd)

    def holding(self, names: Iterable[str]) -> contextlib.AbstractContextManager[None]:
        """The regions named (those registered) are in use by one request until the block
        ends: an unregistering meanwhile waits for it (`unregister`)."""
        if not self.regions:  # the common case: no generator per request
            return _NOTHING_HELD
        return self._holding(names)

    @contextlib.contextmanager
    def _holding(self, names: Iterable[str]) -> Iterator[None]:
        held = [region for region in map(self.regions.get, set(names)) if region is not None]
        for region in held:
            region.users += 1
        try:
            yield
        finally:
            for region in held:
                region.users -= 1
                if region.unregistered and not region.users:
                    if self.regions.get(region.name) is region:
                        self._remove(region)

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
            raise _past_end(name)
        return region, region.offset + offset

    def read(self, name: str, offset: int, size: int) -> bytes:
        """`size` bytes at `offset` in the region, as the object holds them now.

        pread, not a mapping: a client may truncate its object at any time, and a read past its
        end is then a short read here (an error), where a mapping's would be SIGBUS.
        """
        on_device = self._cuda_span(name, offset, size)
        if on_device is not None:
            region, address = on_device
            with _copying(name), cuda.on_device(region.device_id):
                return cuda.copy_to_host(address, size).tobytes()
        with self._open_span(name, offset, size) as (fd, start):
            data = os.pread(fd, size, start)
            if len(data) == size:
                return data
            # Short: the object ends inside the span, or one call stopped at Linux's 2 GiB cap.
            buffer = bytearray(data)
            while len(buffer) < size:
                more = os.pread(fd, size - len(buffer), start + len(buffer))
                if not more:
                    raise _past_end(name)
                buffer += more
            return bytes(buffer)

    @contextlib.contextmanager
    def _open_span(self, name: str, offset: int, size: int) -> Iterator[tuple[int, int]]:
        """The span's object for one copy, as (descriptor, start). The region is found and its
        descriptor duplicated in one hold of the lock; the copy then runs without it, so an
        unregistering on the loop (which closes the region's descriptor under the lock) never
        waits for a copy on a thread, nor does any other request's region, and a duplicate
        stays valid past that close. Out of descriptors, the copy holds the lock instead."""
        with self._descriptors:
            region, start = self._span(name, offset, size)
            try:
                fd = os.dup(region.object.fd)
            except OSError:
                fd = -1
            if fd < 0:
                yield region.object.fd, start
                return
        try:
            yield fd, start
        finally:
            os.close(fd)

    def lend_input(
        self, name: str, offset: int, size: int, config: mc.ModelConfig | None = None
    ) -> memoryview | DeviceArray | None:
        """The span as a writable private mapping for an in-process worker (zero copies), or
        None where it is copied instead (`read`): an object not ours, a span under
        LEND_MIN_BYTES, no mapping to be had.

        Private (copy-on-write): the model may write its input, as Triton lets it, and the
        client's object never sees it.

        In a CUDA region: for a model whose `config` takes GPU inputs
        (FORCE_CPU_ONLY_INPUT_TENSORS "no") a copy of the span on the region's GPU, the model's
        own as a mapping's private pages are; else None (`read` copies it to the host).
        """
        on_gpu = self._cuda_span(name, offset, size)
        if on_gpu is not None:
            region, address = on_gpu
            if config is None or cpu_only_input_tensors(config):
                return None
            client = DeviceArray(address, (size,), np.dtype(np.uint8), region.device_id, region)
            with _copying(name):
                return client.copy_to(region.device_id)
        with self._descriptors:
            return self._lend_input(name, offset, size)

    def _lend_input(self, name: str, offset: int, size: int) -> memoryview | None:
        region, start = self._span(name, offset, size)
        if size < LEND_MIN_BYTES:
            return None
        found = os.fstat(region.object.fd)  # the object as it is now, each time
        if found.st_uid != os.geteuid():
            return None  # another uid's: copied, so a truncation is an error and no signal
        if start + size > found.st_size:
            raise _past_end(name)  # the same error as for a copy
        first_page = start - start % mmap.ALLOCATIONGRANULARITY
        try:
            mapping = mmap.mmap(
                region.object.fd,
                start + size - first_page,
                flags=mmap.MAP_PRIVATE,
                prot=mmap.PROT_READ | mmap.PROT_WRITE,
                offset=first_page,
            )
        except (OSError, ValueError):  # out of descriptors or address space: copy instead
            return None
        return memoryview(mapping)[start - first_page :]

    def lend_output(
        self, name: str, offset: int, size: int
    ) -> RegionWriter | CudaRegionWriter | None:
        """A writer of the span that an in-process worker writes an output with, from the
        model's own array when the model sends it, or None where the door writes it (`write`,
        which also says what is wrong with the region, once the model has run)."""
        cuda_region = self.cuda_regions.get(name)
        if cuda_region is not None:
            if offset < 0 or size < 0 or offset + size > cuda_region.byte_size:
                return None
            return CudaRegionWriter(cuda_region, cuda_region.mapping.pointer + offset, size)
        if size < LEND_MIN_BYTES or offset < 0:
            return None
        try:
            # Found and its descriptor copied in one hold of the lock: an unregistering on the
            # loop closes the descriptor only under it (a conversion may run on a thread).
            with self._descriptors:
                region = self.regions.get(name)
                if region is None or offset + size > region.byte_size:
                    return None
                return RegionWriter(region.object.fd, region.offset + offset, size)
        except OSError:  # out of descriptors: the door writes it
            return None

    def write(
        self, name: str, offset: int, size: int, output: str, data: bytes | bytearray
    ) -> None:
        on_device = self._cuda_span(name, offset, size)
        if on_device is not None:
            _check_fits(output, size, data)
            region, address = on_device
            host = memoryview(data).cast("B")
            with _copying(name), cuda.on_device(region.device_id):
                cuda.copy(address, _address_of(host), host.nbytes)
            return
        with self._open_span(name, offset, size) as (fd, start):
            _check_fits(output, size, data)
            # The object's current size, not the registered one: it may have been truncated. A
            # truncation between this check and the pwrite cannot crash either: pwrite then
            # grows the client's object back (sparse, at most to the region's registered end).
            if start + len(data) > os.fstat(fd).st_size:
                raise _past_end(name)
            view = memoryview(data)
            while view:
                written = os.pwrite(fd, view, start)
                view = view[written:]
                start += written

    def close(self) -> None:
        for region in list(self.regions.values()):
            self._remove(region)
        self.cuda_regions.clear()


class RegionWriter:
    """Writes one output into a span of a client's object, on the model's thread (codec.py's
    `OutputSink`): `pwrite` from the model's array, the one copy, with no `bytes` between.

    It has a descriptor of its own (a dup), closed when the writer is dropped: a model thread
    still writing when its request ends (cancelled, the region unregistered) never writes
    through a descriptor that was closed, or reused for another file. As `write` (above), a
    span past the object's current end is no signal: `write` answers False and the door then
    answers Triton's error, as it does for a span the output does not fit.
    """

    __slots__ = ("fd", "start", "size")

    def __init__(self, fd: int, start: int, size: int) -> None:
        self.fd = -1  # for __del__, should the dup fail
        self.fd = os.dup(fd)
        self.start = start
        self.size = size

    def __del__(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)

    def write(self, data: memoryview | DeviceArray) -> bool:
        """`data` written at the span's start; False (nothing written) where it cannot be."""
        if isinstance(data, DeviceArray):  # a GPU output: through one host copy
            if data.nbytes > self.size:
                return False
            data = data.to_host().reshape(-1).view(np.uint8).data
        if data.nbytes > self.size or self.start + data.nbytes > os.fstat(self.fd).st_size:
            return False
        view = data.cast("B")
        start = self.start
        while view:
            written = os.pwrite(self.fd, view, start)
            view = view[written:]
            start += written
        return True


class CudaRegionWriter:
    """A span of a client's CUDA region that an in-process worker writes an output with when
    the model sends it (`SharedMemory.lend_output`): a GPU output copied on the device, a host
    output copied to it. It holds the region (and so its mapping) until it is dropped, so an
    unregistering meanwhile closes the mapping after the copy. An output too large for the
    span is not written (False): the door then answers Triton's error."""

    __slots__ = ("region", "address", "size")

    def __init__(self, region: CudaRegion, address: int, size: int) -> None:
        self.region = region
        self.address = address
        self.size = size

    def write(self, data: memoryview | DeviceArray) -> bool:
        if data.nbytes > self.size:
            return False
        source = data.pointer if isinstance(data, DeviceArray) else _address_of(data)
        try:
            with cuda.on_device(self.region.device_id):
                cuda.copy(self.address, source, data.nbytes)
        except cuda.CudaError:
            return False  # the door's own write then answers with CUDA's reason
        return True


@contextlib.contextmanager
def _copying(region: str) -> Iterator[None]:
    """A copy from or to a client's CUDA region: a CUDA failure is INTERNAL, with its reason."""
    try:
        yield
    except cuda.CudaError as exc:
        raise DoorError(
            ErrorCode.INTERNAL, f"failed to copy CUDA shared memory region '{region}': {exc}"
        ) from None


def _check_fits(output: str, size: int, data: bytes | bytearray) -> None:
    if len(data) > size:
        raise DoorError(
            ErrorCode.INTERNAL,
            f"shared memory size specified with the request for output '{output}' "
            f"({size} bytes) should be at least {len(data)} bytes to hold the results",
        )


def _address_of(data: memoryview) -> int:
    """The address of a contiguous byte buffer (bytes, bytearray or a view of one)."""
    return int(np.frombuffer(data, dtype=np.uint8).ctypes.data)


def _past_end(name: str) -> DoorError:
    return DoorError(
        ErrorCode.INVALID_ARG, f"Invalid offset + byte size for shared memory region: '{name}'"
    )


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
