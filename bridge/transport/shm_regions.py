"""Shared memory regions that carry one request's tensors between a door and a worker on the
same host: their names, who may use them, how they are written, read and freed.

Why: across processes Dynamo's request plane copies a tensor's bytes several times (msgpack,
TCP, Rust ⇄ Python), about 1 ns a byte each way (spec dynamo_runtime.md §8); a POSIX shared
memory object costs a few syscalls whatever its size. The request plane then carries only the
object's name (shm_exchange.py says what each side sends).

**Same host.** `host_id()` names what two processes must share for a region one of them makes
to be the region the other opens: the kernel (`boot_id`, not `machine-id`, which cloned
machines share), the file system under /dev/shm (a container with a /dev/shm of its own has
another device), and the pid namespace (the sweep below reads pids). A worker publishes it in
its control endpoint's index answer; the door compares it with its own. `DYN_BRIDGE_SHM_HOST_ID`
replaces it (a test can make a worker look remote), and `none` turns the shared memory form off
for the process (it then neither offers nor accepts it).

**Names.** `dynbridge-<pid ns>-<door pid>-<token>-<i|o|p><k>`: every region belongs to one
door process (its pid, and a token unique in that process), whoever made it: a request's own
regions (the door makes the inputs' region `i`, the worker each answer's outputs' region `o<k>`)
or one of the door's pooled regions `p`, reused from request to request (shm_pool.py says who
may touch one when). A name from the request plane is checked against that pattern and opened
as one entry of /dev/shm, never as a path (ARCHITECTURE.md's security rules).

**Lifetime.** A request's own name lives no longer than its request (a pooled one, no longer
than its door; shm_pool.py):
- the door unlinks the inputs' region when the request ends however it ends, and each answer's
  region as soon as it has read it; a request that did not end with its final answer (an
  error, a cancellation, the worker gone) also unlinks every `o` region left with its token;
- a worker that makes a region after the door gave up on the request (it had not seen the
  cancellation yet) leaves a name nobody reads: the door's periodic sweep unlinks its own
  names whose token is no longer in flight;
- a door that dies (SIGKILL) leaves its names, pooled ones too, to every bridge process on the
  host: each sweeps at start-up and every SWEEP_S, unlinking the names whose door pid no longer
  runs.
Unlinking frees the name at once and the memory once no process maps it any more: a worker
whose model still holds an input view keeps it valid.

Mapping: only the worker maps (inputs, copy-on-write, so a model gets writable numpy views, as
Triton hands it, and can never change the door's bytes); everything else is pread/pwrite on a
descriptor, so a peer that truncated a region can cost an error, never a SIGBUS. Sizes are
never trusted: the object's fstat size must be the size the message says, and every tensor's
span must lie inside it.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import mmap
import os
import re
import stat
from collections.abc import Callable, Iterable
from functools import cache

log = logging.getLogger(__name__)

SHM_DIRECTORY = "/dev/shm"
PREFIX = "dynbridge-"
HOST_ID_ENV = "DYN_BRIDGE_SHM_HOST_ID"
# How often every process looks for regions whose door is gone (or, in a door, whose request
# is over); also done once at start-up. DYN_BRIDGE_SHM_SWEEP_S sets it (the tests do).
SWEEP_S = 5.0
SWEEP_ENV = "DYN_BRIDGE_SHM_SWEEP_S"
# Tensors are placed at offsets of this alignment: numpy views of any dtype are aligned.
ALIGN = 64
# A pooled region's first bytes: its generation (little-endian u64), the rest unused, so that
# tensors after it stay aligned.
HEADER = ALIGN
POOLED = "p"

_NAME = re.compile(r"dynbridge-(\d+)-(\d+)-(\d+)-([iop])(\d*)")
_CREATE = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


# What names one object whatever its names (hard links): (st_dev, st_ino).
Identity = tuple[int, int]


def identity(found: os.stat_result) -> Identity:
    return found.st_dev, found.st_ino


class RegionError(Exception):
    """A region that cannot be used as the message says; `str()` says why."""


class StaleRegion(RegionError):
    """A pooled region the door has given to another request (or is rewriting for one)."""


def _pid_namespace() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


@cache
def pid_namespace() -> int:
    """This process's pid namespace (its inode): every name carries it."""
    try:
        return _pid_namespace()
    except OSError:
        return 0


@cache
def host_id() -> str:
    """What must be equal for two processes to share regions (module doc), "" when this
    process takes no part in the shared memory form."""
    override = os.environ.get(HOST_ID_ENV, "").strip()
    if override:
        return "" if override.lower() == "none" else override
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        device = os.stat(SHM_DIRECTORY).st_dev
        namespace = _pid_namespace()
    except OSError as exc:
        log.info("no shared memory between bridge processes: %s", exc)
        return ""
    return f"{boot}/{device}/{namespace}"


def request_prefix(token: int) -> str:
    """The names of one request of this (door) process: `<prefix>i`, `<prefix>o<k>`."""
    return f"{PREFIX}{pid_namespace()}-{os.getpid()}-{token}-"


def parse(name: str) -> tuple[int, int, int, str] | None:
    """(pid namespace, door pid, token, kind 'i'|'o'|'p') of one of our names, else None."""
    match = _NAME.fullmatch(name)
    if match is None:
        return None
    return int(match[1]), int(match[2]), int(match[3]), match[4]


def _directory() -> int:
    return os.open(SHM_DIRECTORY, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def create(name: str, size: int) -> int:
    """A new region `name` of `size` bytes (zeros), open read-write; FileExistsError if the
    name is taken (a token is never reused, so only by a stale region)."""
    directory = _directory()
    try:
        fd = os.open(name, _CREATE, 0o600, dir_fd=directory)
    finally:
        os.close(directory)
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        unlink(name)
        raise
    return fd


def write(fd: int, data: memoryview, offset: int) -> None:
    """All of `data` at `offset` (pwrite may write less than asked)."""
    while data:
        written = os.pwrite(fd, data, offset)
        data = data[written:]
        offset += written


def open_sized(name: str, size: int, writable: bool = False) -> int:
    """`name`, opened read-only (or read-write), after checking it is a region of exactly
    `size` bytes."""
    if parse(name) is None:
        raise RegionError(f"'{name}' is not a bridge shared memory region")
    directory = _directory()
    flags = _OPEN | os.O_RDWR if writable else _OPEN  # (O_RDONLY is 0)
    try:
        fd = os.open(name, flags, dir_fd=directory)
    except FileNotFoundError:
        raise RegionError(f"shared memory region '{name}' does not exist") from None
    except OSError as exc:
        raise RegionError(f"cannot open shared memory region '{name}': {exc}") from None
    finally:
        os.close(directory)
    found = os.fstat(fd)
    if not stat.S_ISREG(found.st_mode) or found.st_size != size:
        os.close(fd)
        raise RegionError(
            f"shared memory region '{name}' holds {found.st_size} bytes, the message says {size}"
        )
    return fd


def hold(fd: int, name: str, generation: object) -> None:
    """Take a shared lock on pooled region `name` (open as `fd`) without waiting, and check it
    still holds `generation`: StaleRegion if the door is rewriting it or has given it to
    another request. The lock lasts while `fd`, or a mapping made from it, stays open."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise StaleRegion(f"shared memory region '{name}' is being reused") from None
    found = int.from_bytes(os.pread(fd, 8, 0), "little")
    if type(generation) is not int or found != generation:
        raise StaleRegion(f"shared memory region '{name}' belongs to another request now")


def map_private(fd: int, size: int) -> mmap.mmap:
    """The region copy-on-write: writable for this process, the creator's bytes untouched."""
    return mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def check_span(name: str, size: int, span: object) -> tuple[int, int]:
    """A tensor's `[offset, length]` in a region of `size` bytes, checked."""
    if (
        not isinstance(span, list | tuple)
        or len(span) != 2
        or not all(type(v) is int for v in span)
        or span[0] < 0
        or span[1] < 0
        or span[0] + span[1] > size
    ):
        raise RegionError(f"tensor span {span!r} does not lie in region '{name}' ({size} bytes)")
    return span[0], span[1]


def unlink(name: str) -> bool:
    """Remove the name (the memory goes once nobody maps it); False when it was gone."""
    directory = _directory()
    try:
        os.unlink(name, dir_fd=directory)
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(directory)


def names() -> list[str]:
    """Our regions on this host, whoever made them."""
    try:
        return [n for n in os.listdir(SHM_DIRECTORY) if n.startswith(PREFIX)]
    except OSError:
        return []


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: running
    return True


def sweep(in_flight: Callable[[], Iterable[int]] | None = None) -> int:
    """Unlink the regions of this pid namespace whose door no longer runs, and, given
    `in_flight` (a door's requests still going and its pooled regions), this process's own
    whose token is not in it; how many."""
    me, namespace = os.getpid(), pid_namespace()
    mine: set[int] | None = None
    removed = 0
    for name in names():
        parsed = parse(name)
        if parsed is None or parsed[0] != namespace:
            continue  # another pid namespace's pids mean nothing here
        _, pid, token, _ = parsed
        if pid == me:
            if in_flight is None:
                continue
            if mine is None:
                mine = set(in_flight())
            if token in mine:
                continue
        elif _running(pid):
            continue
        removed += unlink(name)
    return removed


class Sweeper:
    """Sweeps at start and every SWEEP_S while started (one per process that uses regions);
    `also` runs after each sweep (the door's pool lets its idle regions go)."""

    def __init__(
        self,
        in_flight: Callable[[], Iterable[int]] | None = None,
        also: Callable[[], object] | None = None,
    ) -> None:
        self._in_flight = in_flight
        self._also = also
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None and host_id():
            self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        period = float(os.environ.get(SWEEP_ENV) or SWEEP_S)
        while True:
            try:
                removed = sweep(self._in_flight)
                if self._also is not None:
                    self._also()
                if removed:
                    log.info("freed %d shared memory regions of requests that are over", removed)
            except Exception as exc:  # keep sweeping; the next round may succeed
                log.warning("sweeping shared memory regions failed: %s", exc)
            await asyncio.sleep(period)
