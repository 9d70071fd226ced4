"""The door's pool of shared memory regions, reused from request to request.

Why: a new tmpfs region costs its writer a page allocation per 4 KB and its last user a free
per page at unlink; at 4 MB that is 1.8 ms against 0.65 ms for writing into pages a region
already has (docs/benchmarks.md, "Shared memory between door and worker"). A region the door
keeps and rewrites pays only the copy. The pool holds the inputs of a request, and a region
offered for its answer (shm_exchange.py).

Who may touch a pooled region, and when:
- **the door** rewrites a region (its generation, then a request's inputs) only while it holds
  an exclusive flock on it, taken without waiting. If it cannot, a worker still uses the
  region, and the door takes another;
- **a worker** takes a shared flock on the region before it reads the region's generation,
  and holds it while it maps the region or writes an answer into it (`shm_regions.hold`). A
  mapping keeps a duplicate of its descriptor, so the lock lasts as long as the last numpy view
  a model keeps of an input;
- **the generation** is written by the door under its exclusive lock and sent with the request.
  A request that reaches a worker late (cancelled, or sent again elsewhere) finds another
  generation once its region has been given to another request, and is refused.

So a region's bytes never change under a worker that uses them, however a request ends. The
kernel drops a crashed worker's locks. A crashed door's regions carry its pid in their names
and are swept like its other names (shm_regions.sweep).

Bounds: the regions' sizes add up to at most `limit` bytes (DYN_BRIDGE_SHM_POOL_BYTES; 0 turns
the pool off). A request that finds no free region that fits, and no room for a new one, gets
regions of its own as before. A region unused for IDLE_S is unlinked.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from . import shm_regions
from .shm_regions import POOLED, Identity

POOL_BYTES = 128 << 20
POOL_ENV = "DYN_BRIDGE_SHM_POOL_BYTES"
# The smallest region made: smaller ones would be remade as tensors grow.
MIN_REGION = 1 << 20
# A free region unused this long is unlinked (its pages go back to the system).
IDLE_S = 30.0


@dataclass(eq=False)
class Pooled:
    """One region of the pool: open read-write in the door for its whole life."""

    name: str
    token: int
    fd: int
    size: int
    identity: Identity  # (a client must not register it under another name: shm.py)
    generation: int = 0
    idle_since: float = 0.0

    def unlock(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def entry(self) -> dict[str, int | str]:
        """How a request names it (docs/worker_protocol.md §3)."""
        return {"region": self.name, "size": self.size, "generation": self.generation}


def _region_size(needed: int) -> int:
    return max(MIN_REGION, 1 << (needed - 1).bit_length())


class RegionPool:
    """The door's pooled regions (thread-safe: the door fills large requests on a thread)."""

    def __init__(self, prefix: str, next_token: Callable[[], int], limit: int) -> None:
        self._prefix = prefix  # this door's part of a name: `dynbridge-<ns>-<pid>-`
        self._next_token = next_token
        self.limit = limit
        self._lock = threading.Lock()
        self._free: list[Pooled] = []  # the most recently given back last
        self._taken: set[Pooled] = set()
        self._total = 0  # bytes of every region, free or taken
        self._generations = 0

    def take(self, needed: int) -> Pooled | None:
        """A region of at least `needed` bytes (its header included), exclusively locked with
        a new generation written: the caller writes into it, then `unlock`s it. None when no
        free region fits and none can be made within the limit."""
        if needed > self.limit:
            return None
        with self._lock:
            region = self._reuse(needed) or self._make(needed)
            if region is None:
                return None
            self._generations += 1
            region.generation = self._generations
            self._taken.add(region)
        try:
            os.pwrite(region.fd, region.generation.to_bytes(8, "little"), 0)
        except OSError:
            region.unlock()
            self.give_back(region)
            raise
        return region

    def _reuse(self, needed: int) -> Pooled | None:
        # The smallest that fits, the most recently used among equals (its pages are warm).
        fitting = sorted(
            (r for r in reversed(self._free) if r.size >= needed), key=lambda r: r.size
        )
        for region in fitting:
            try:
                fcntl.flock(region.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a worker still maps it (a model keeps an input view)
            self._free.remove(region)
            return region
        return None

    def _make(self, needed: int) -> Pooled | None:
        size = _region_size(needed)
        if size > self.limit:
            return None  # not even with every free one dropped
        while self._total + size > self.limit:
            if not self._free:
                return None
            self._drop(self._free.pop(0))  # the longest unused
        token = self._next_token()
        name = f"{self._prefix}{token}-{POOLED}"
        fd = shm_regions.create(name, size)
        fcntl.flock(fd, fcntl.LOCK_EX)  # new: nobody else has it open
        self._total += size
        return Pooled(name, token, fd, size, shm_regions.identity(os.fstat(fd)))

    def _drop(self, region: Pooled) -> None:
        os.close(region.fd)
        shm_regions.unlink(region.name)
        self._total -= region.size

    def give_back(self, region: Pooled) -> None:
        """The request that took `region` is over (however it ended: the generation guards
        the region against a late worker)."""
        with self._lock:
            if region not in self._taken:
                return
            self._taken.discard(region)
            region.idle_since = time.monotonic()
            self._free.append(region)

    def tokens(self) -> list[int]:
        """The tokens of every region of the pool (the door's sweep keeps them)."""
        with self._lock:
            return [r.token for r in (*self._free, *self._taken)]

    def holds(self, identity: Identity) -> bool:
        """Is `identity` the object of one of the pool's regions?"""
        with self._lock:
            return any(r.identity == identity for r in (*self._free, *self._taken))

    def trim(self, idle_s: float = IDLE_S) -> int:
        """Unlink the free regions unused for `idle_s`; how many."""
        now = time.monotonic()
        with self._lock:
            old = [r for r in self._free if now - r.idle_since >= idle_s]
            for region in old:
                self._free.remove(region)
                self._drop(region)
        return len(old)

    def close(self) -> None:
        """The door stops: every region goes (a worker's mapping stays valid)."""
        with self._lock:
            for region in (*self._free, *self._taken):
                self._drop(region)
            self._free.clear()
            self._taken.clear()
