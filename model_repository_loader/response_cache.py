"""Triton's response cache (`--cache-config local,size=N`, `response_cache { enable: true }`).

One cache per loaded repository, shared by all its models and bounded in bytes; the least
recently used entries go first when an insert needs room (as Triton's `local` cache). A model
version owns its entries (`owner`): unloading or reloading a model drops them.

What a key covers: Triton hashes the model's name and version and each input's name and bytes,
sorted by name (core's cache_manager.cc); request parameters, the request id and the requested
outputs are not part of it, so two requests that differ only there share an entry [V on 2.51].
The bridge's key adds each input's datatype and shape and the requested outputs: Triton answers
a request for all outputs with an entry filled by one that asked for a subset [V] (and two inputs
with the same bytes but another shape share its entry), which a client cannot tell from a wrong
answer. It also adds every request parameter a model can read (`CacheKeys`), header-forwarded
ones included: with Triton, a model that answers per tenant (`--grpc-header-forward-pattern`)
serves one tenant's cached answer to another (issue 38). Parameters Triton consumes itself
(`sequence_id`, `priority`, `timeout`, ...) never reach the model and stay out; a model lists
the others that do not change its answer in its config, as a comma-separated
`BRIDGE_CACHE_KEY_IGNORES` parameter (e.g. a request's trace or user id). Triton also keeps
entries across an unload and a reload of the model [V]; the bridge drops them, so a reloaded
model.py never answers with its predecessor's results.

The key is hashed (BLAKE2b) where the request is admitted, on the caller's thread: a model with
the cache enabled and inputs of megabytes pays about 2 ms per MiB there (measured on a busy
machine: 7.8 ms for 4 MiB).

An ensemble whose config enables the cache is cached at its top level (a hit runs none of its
steps), and each composing model by its own config, as in Triton.

Only successful responses without an error are stored; a response larger than the whole cache
is not stored at all (Triton logs that the insert failed).
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from . import pb_utils
from .inference import TRITON_PARAMETERS, InferRequest, ParameterValue

if TYPE_CHECKING:  # an instance process in a model's own environment has no tritonclient
    from tritonclient.grpc import model_config_pb2 as mc

# What an entry costs beyond its tensors' bytes (bookkeeping, names, shapes), so that a cache of
# many tiny entries is still bounded by its size.
ENTRY_OVERHEAD_BYTES = 64

Key = tuple[int, bytes]  # (owner, digest of the request)


@dataclass(frozen=True, slots=True)
class _Entry:
    tensors: tuple[tuple[str, np.ndarray, str], ...]  # name, array (read-only copy), datatype
    parameters_json: str
    size: int


@dataclass(slots=True)
class CacheCounters:
    """Triton's cache-wide gauges (`nv_cache_*`): counts, and durations in nanoseconds."""

    entries: int = 0
    used_bytes: int = 0
    capacity_bytes: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    lookup_ns: int = 0
    insert_ns: int = 0

    @property
    def lookups(self) -> int:
        return self.hits + self.misses


class ResponseCache:
    """A size-bounded LRU map from requests to their finished responses; thread-safe."""

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 1:
            raise ValueError(f"response cache size must be >= 1 byte, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[Key, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._used = 0
        self._owners = itertools.count(1)
        self._counters = CacheCounters(capacity_bytes=capacity_bytes)

    def new_owner(self) -> int:
        """A token for one model version's entries (see `drop`)."""
        return next(self._owners)

    def lookup(self, key: Key) -> pb_utils.InferenceResponse | None:
        """The response stored for `key` (a fresh copy), or None; counts a hit or a miss."""
        start = time.monotonic_ns()
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self._counters.hits += 1
            else:
                self._counters.misses += 1
            self._counters.lookup_ns += time.monotonic_ns() - start
        if entry is None:
            return None
        # Copies: a caller (a BLS model) may write into what it receives, as into any output.
        tensors = [
            pb_utils.Tensor._from_wire(name, array.copy(), datatype)
            for name, array, datatype in entry.tensors
        ]
        return pb_utils.InferenceResponse._create(tensors, None, entry.parameters_json)

    def insert(self, key: Key, response: pb_utils.InferenceResponse | None) -> bool:
        """Store `response` for `key`; False if an entry was there already (Triton's
        ALREADY_EXISTS, which does not count as a miss). An error response, or one larger than
        the cache, is not stored (True: it still was a miss)."""
        start = time.monotonic_ns()
        entry = _entry_of(response) if response is not None and not response.has_error() else None
        with self._lock:
            if key in self._entries:
                return False
            if entry is not None and entry.size <= self.capacity_bytes:
                while self._used + entry.size > self.capacity_bytes:
                    _, evicted = self._entries.popitem(last=False)
                    self._used -= evicted.size
                    self._counters.evictions += 1
                self._entries[key] = entry
                self._used += entry.size
            self._counters.insert_ns += time.monotonic_ns() - start
        return True

    def drop(self, owner: int) -> None:
        """Forget every entry of `owner` (its model version is unloaded or replaced)."""
        with self._lock:
            for key in [k for k in self._entries if k[0] == owner]:
                self._used -= self._entries.pop(key).size

    def counters(self) -> CacheCounters:
        with self._lock:
            counters = CacheCounters(**{f: getattr(self._counters, f) for f in _COUNTER_FIELDS})
            counters.entries = len(self._entries)
            counters.used_bytes = self._used
            return counters


_COUNTER_FIELDS = ("capacity_bytes", "hits", "misses", "evictions", "lookup_ns", "insert_ns")


class MissCounter(Protocol):
    """Where a miss is counted (scheduling.stats.ModelStats)."""

    def record_cache_miss(self, duration_ns: int) -> None: ...


class CacheFill:
    """A request the cache missed: where its (single, final) response is stored once shaped.

    Built by the model version that looked the request up; `Pending.deliver` hands it the
    response, so the store happens on the response's way back without a call up a layer.
    """

    __slots__ = ("_cache", "_key", "_lookup_ns", "_misses")

    def __init__(self, cache: ResponseCache, key: Key, lookup_ns: int, misses: MissCounter) -> None:
        self._cache = cache
        self._key = key
        self._lookup_ns = lookup_ns
        self._misses = misses

    def store(self, response: pb_utils.InferenceResponse | None) -> None:
        start = time.monotonic_ns()
        if self._cache.insert(self._key, response):  # not a miss when another stored it first
            self._misses.record_cache_miss(self._lookup_ns + time.monotonic_ns() - start)


IGNORES_PARAMETER = "BRIDGE_CACHE_KEY_IGNORES"


class CacheKeys:
    """How one model's requests become cache digests (module doc)."""

    __slots__ = ("_ignored",)

    def __init__(self, config: mc.ModelConfig) -> None:
        listed = (
            config.parameters[IGNORES_PARAMETER].string_value
            if (IGNORES_PARAMETER in config.parameters)
            else ""
        )
        self._ignored = TRITON_PARAMETERS | {n.strip() for n in listed.split(",") if n.strip()}

    def digest(self, request: InferRequest, requested: Iterable[str]) -> bytes:
        params = request.parameters
        kept = sorted(
            (name, type(value).__name__, value)
            for name, value in (params.items() if params else ())
            if name not in self._ignored and not name.startswith("triton_")
        )
        return request_digest(request.inputs, requested, kept)


def request_digest(
    inputs: Iterable[pb_utils.Tensor],
    requested: Iterable[str],
    parameters: Iterable[tuple[str, str, ParameterValue]] = (),
) -> bytes:
    """What a request is, for the cache: its inputs (name, datatype, shape, bytes; sorted by
    name), the outputs it asked for and `parameters` (name, type, value; sorted). Model and
    version are the key's owner."""
    digest = hashlib.blake2b(digest_size=16)
    for tensor in sorted(inputs, key=lambda t: t._name):
        digest.update(repr((tensor._name, tensor._datatype, tensor._dims())).encode())
        _update_with_data(digest, tensor)
    digest.update(repr(sorted(requested)).encode())
    digest.update(repr(list(parameters)).encode())
    return digest.digest()


def _update_with_data(digest: hashlib.blake2b, tensor: pb_utils.Tensor) -> None:
    if tensor._datatype != "BYTES":
        digest.update(np.ascontiguousarray(tensor._array).view(np.uint8).reshape(-1).data)
        return
    for item in tensor._wire_array().reshape(-1).tolist():
        digest.update(len(item).to_bytes(4, "little"))
        digest.update(item)


def _entry_of(response: pb_utils.InferenceResponse) -> _Entry:
    tensors = []
    size = ENTRY_OVERHEAD_BYTES
    for tensor in response._output_tensors:
        array = tensor._wire_array() if tensor._datatype == "BYTES" else tensor._array
        array = array.copy()
        array.flags.writeable = False
        if tensor._datatype == "BYTES":
            size += sum(4 + len(item) for item in array.reshape(-1).tolist())
        else:
            size += array.nbytes
        size += ENTRY_OVERHEAD_BYTES
        tensors.append((tensor._name, array, tensor._datatype))
    return _Entry(tuple(tensors), response._parameters, size)
