"""One request's tensors through shared memory: what the door and the worker each do with the
regions of shm_regions.py, and what the request plane carries instead of the bytes.

The request plane message stays the bridge form (docs/worker_protocol.md §2) with two changes:

- the request carries `"shm": {"host", "prefix", "threshold", "region"?, "size"?,
  "generation"?, "reply"?}`: the door's host id (the worker refuses a region from another
  host), the names its answers' own regions must take (`<prefix>o<k>`), the size from which an
  output goes to a region, and, when some input did, the inputs' region and its size: one of
  the door's pooled regions with its generation (shm_pool.py), else `<prefix>i`; `reply`
  (`{"region", "size", "generation"}`) is a pooled region offered for one answer's outputs;
- a tensor placed in a region has `"data": {"data_type", "shm": [offset, length]}` instead of
  `values`; so has an answer's tensor, the answer then carrying `"shm": {"region", "size"}`.

Tensors below the threshold stay inline (`values` as bytes): for them a region costs more
(creating, sizing, unlinking) than the request plane's copies (docs/benchmarks.md has the
crossover). Outputs: the worker writes an answer's outputs into the offered `reply` region when
they fit (once per request), else into a region of its own per answer, sized to what it holds,
which the door reads and unlinks. The door sizes its offer from the inputs and from the last
answer of the same model: it cannot know the outputs' sizes, nor how many answers a decoupled
model sends.

Copies: the door writes an input once into the region (pwrite), and the worker's model gets a
copy-on-write numpy view of it (no copy); the worker writes an output once (pwrite from its
array), and the door reads it once into the `bytes` its wire sends (pread).
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, TypeGuard

from model_repository_loader.pb_utils import Tensor
from model_repository_loader.pb_utils.errors import ErrorCode
from model_repository_loader.validation import RequestError

from ..codec import TO_DYNAMO, encode_raw_tensor, raw_array, raw_contents
from ..offload import run_off_loop
from . import shm_regions
from .shm_pool import POOL_BYTES, POOL_ENV, Pooled, RegionPool
from .shm_regions import (
    ALIGN,
    HEADER,
    POOLED,
    Identity,
    RegionError,
    StaleRegion,
    Sweeper,
    host_id,
)

log = logging.getLogger(__name__)

# A tensor of at least this many bytes travels in a region (measured crossover:
# docs/benchmarks.md, "Shared memory between door and worker"); DYN_BRIDGE_SHM_THRESHOLD (bytes,
# read by the door) sets it.
THRESHOLD = 128 * 1024
THRESHOLD_ENV = "DYN_BRIDGE_SHM_THRESHOLD"
# The door copies a request's tensors into (or an answer's out of) a region of at least this
# many bytes on a thread, so the event loop is not held for more than a few ms (pwrite and
# pread let go of the GIL); a smaller one on the loop, where a thread hop would cost more.
OFF_LOOP_BYTES = 8 << 20
_PREFIX = re.compile(r"dynbridge-\d+-\d+-\d+-")


def _aligned(size: int) -> int:
    return -(-size // ALIGN) * ALIGN


# How a worker's refusal of the shared memory form begins (an INTERNAL error, rejected): the
# door then sends that instance the bytes form (`Exchange.refused`).
REFUSED = "shared memory form refused: "


def _failure(message: str) -> RequestError:
    return RequestError(REFUSED + message, ErrorCode.INTERNAL)


# -- the door's side ----------------------------------------------------------------------------


class ShmDoor:
    """The door process's part: which worker instances share its host, its requests in flight,
    its pool of regions, and the sweeper that frees what they left."""

    def __init__(self, threshold: int | None = None, pool_bytes: int | None = None) -> None:
        self.host = host_id()
        if threshold is None:
            threshold = int(os.environ.get(THRESHOLD_ENV) or THRESHOLD)
        self.threshold = max(1, threshold)
        if pool_bytes is None:
            pool_bytes = int(os.environ.get(POOL_ENV) or POOL_BYTES)
        # control instance id → the host id it published (its index answer); one process's
        # model endpoints have the same instance id as its control endpoint
        self.hosts: dict[int, str] = {}
        # instances that refused a region (another user, a /dev/shm of their own): bytes form
        self.refused: set[int] = set()
        self._tokens = itertools.count(1)
        self._names = shm_regions.request_prefix(0)[: -len("0-")]  # this process's part
        self._in_flight: set[int] = set()  # tokens of the requests not closed yet
        # The objects of the inputs' own regions of requests in flight (`made`); a set, so
        # that a thread writing a request's inputs and the loop asking never race.
        self._input_objects: set[Identity] = set()
        self.pool = RegionPool(self._names, lambda: next(self._tokens), max(0, pool_bytes))
        self.sweeper = Sweeper(self.kept, also=self.pool.trim)

    def same_host(self, instance_id: int) -> bool:
        return (
            bool(self.host)
            and self.hosts.get(instance_id) == self.host
            and instance_id not in self.refused
        )

    def exchange(self, answer_bytes: int | None = None) -> Exchange | None:
        """A request's exchange, or None when no worker shares this host. `answer_bytes`: the
        size of the model's last answer read from a region, 0 if it came inline, None if
        unknown (what to offer this one)."""
        if not self.host or self.host not in self.hosts.values():
            return None
        token = next(self._tokens)
        self._in_flight.add(token)
        return Exchange(self, token, f"{self._names}{token}-", answer_bytes)

    def made(self, identity: Identity) -> bool:
        """Is `identity` (st_dev, st_ino) the object of a region this door made and still uses
        (its pool's, its requests' inputs')? A client of the door must not register one under
        a name of its own (a hard link): it would read and write other clients' tensors."""
        return identity in self._input_objects or self.pool.holds(identity)

    def kept(self) -> list[int]:
        """The tokens of this door's regions its sweep must keep: its requests in flight, and
        its pool's."""
        return [*self._in_flight, *self.pool.tokens()]

    def close(self) -> None:
        """The door stops: no more sweeping, and its pooled regions go."""
        self.sweeper.stop()
        self.pool.close()


class Exchange:
    """One request's regions on the door's side (created per request, `close`d at its end)."""

    __slots__ = (
        "_door",
        "token",
        "prefix",
        "_sent",
        "_inputs",
        "_pooled",
        "_reply",
        "_expected",
        "answer_bytes",
        "_shm_to",
    )

    def __init__(self, door: ShmDoor, token: int, prefix: str, expected: int | None = None) -> None:
        self._door = door
        self.token = token
        self.prefix = prefix  # shm_regions.request_prefix(token)
        self._sent: dict | None = None  # the request in the shared memory form, made once
        # the inputs' own region and its object, when one was made
        self._inputs: tuple[str, Identity] | None = None
        self._pooled: list[Pooled] = []  # the pooled regions this request took
        self._reply: Pooled | None = None  # the pooled region offered for an answer
        self._expected = expected  # ShmDoor.exchange's `answer_bytes`
        # None until an answer comes; then the bytes of the largest read from a region, or 0
        self.answer_bytes: int | None = None
        self._shm_to: int | None = None  # the instance last sent the shared memory form

    def request_for(self, instance_id: int, body: dict) -> dict:
        """What to send `instance_id`: the shared memory form on this host, else `body`."""
        if not self._door.same_host(instance_id):
            return body
        self._shm_to = instance_id
        if self._sent is None:
            try:
                self._sent = self._place_inputs(body)
            except OSError as exc:  # /dev/shm full or refused: the bytes form still works
                log.warning("inputs sent inline: %s", exc)
                self._close_inputs()
                self._sent = body
        return self._sent

    async def prepare(self, body: dict, instance_ids: Iterable[int]) -> None:
        """Make the shared memory form ahead, on a thread, when its inputs are large and one
        of `instance_ids` is on this host (`request_for` then only hands it out)."""
        large = sum(
            len(values)
            for tensor in body.get("tensors", ())
            if isinstance(values := tensor.get("data", {}).get("values"), bytes | memoryview)
            and len(values) >= self._door.threshold
        )
        if large < OFF_LOOP_BYTES or not any(map(self._door.same_host, instance_ids)):
            return
        try:
            # Cancelled, it still lets the thread finish with its regions before `close` gives
            # the pooled ones back (another request could take one mid-write).
            self._sent = await run_off_loop(functools.partial(self._place_inputs, body))
        except OSError as exc:  # /dev/shm full or refused: the bytes form still works
            log.warning("inputs sent inline: %s", exc)
            self._close_inputs()
            self._sent = body

    def _place_inputs(self, body: dict) -> dict:
        threshold = self._door.threshold
        shm: dict[str, Any] = {
            "host": self._door.host,
            "prefix": self.prefix,
            "threshold": threshold,
        }
        tensors = list(body.get("tensors", ()))
        placed: list[tuple[int, memoryview, int]] = []  # (tensor index, bytes, offset)
        size = 0
        for index, tensor in enumerate(tensors):
            values = tensor.get("data", {}).get("values")
            if isinstance(values, bytes | bytearray | memoryview) and len(values) >= threshold:
                placed.append((index, memoryview(values).cast("B"), size))
                size = _aligned(size + len(values))
        if placed:
            shm.update(self._write_inputs(tensors, placed, size))
        # An answer like the model's last one, or, not knowing it, like the inputs.
        expected = size if self._expected is None else self._expected
        try:
            reply = self._take(HEADER + _aligned(expected), expected)
        except OSError as exc:  # the answer can still take a region of its own
            log.info("no region offered for the answer: %s", exc)
            reply = None
        if reply is not None:
            reply.unlock()
            self._reply = reply
            shm["reply"] = reply.entry()
        return {**body, "tensors": tensors, "shm": shm}

    def _take(self, needed: int, expected: int) -> Pooled | None:
        """A pooled region for `expected` bytes of tensors (None below the threshold, or when
        the pool has none), kept for `close` to give back."""
        if expected < self._door.threshold:
            return None
        region = self._door.pool.take(needed)
        if region is not None:
            self._pooled.append(region)
        return region

    def _write_inputs(
        self, tensors: list, placed: list[tuple[int, memoryview, int]], size: int
    ) -> dict[str, Any]:
        """Write the placed inputs into a pooled region, or one of their own; its `shm`
        entries."""
        region = self._take(HEADER + size, size)
        if region is not None:
            fd, base, entries = region.fd, HEADER, region.entry()
        else:
            name = self.prefix + "i"
            fd, base, entries = shm_regions.create(name, size), 0, {"region": name, "size": size}
            made = shm_regions.identity(os.fstat(fd))
            self._door._input_objects.add(made)
            self._inputs = (name, made)
        try:
            for index, data, offset in placed:
                shm_regions.write(fd, data, base + offset)
                tensor = tensors[index]
                tensors[index] = {
                    "metadata": tensor["metadata"],
                    "data": {
                        "data_type": tensor["data"]["data_type"],
                        "shm": [base + offset, len(data)],
                    },
                }
        finally:
            if region is not None:
                region.unlock()
            else:
                os.close(fd)
        return entries

    def refused(self, item: Any) -> bool:
        """Is `item` a worker's refusal of the shared memory form (a region it cannot open
        although it published this host's id)? The instance then gets the bytes form, this
        request when sent again and every later one."""
        error = item.get("error") if isinstance(item, dict) else None
        if (
            not isinstance(error, dict)
            or not item.get("rejected")
            or not str(error.get("message", "")).startswith(REFUSED)
            or self._shm_to is None
        ):
            return False
        log.warning("worker instance %x: %s", self._shm_to, error.get("message"))
        self._door.refused.add(self._shm_to)
        return True

    async def take(self, item: Any) -> Any:
        """`receive`, on a thread for a region of OFF_LOOP_BYTES or more."""
        shm = item.get("shm") if isinstance(item, dict) else None
        if shm is None:
            if self.answer_bytes is None and isinstance(item, dict) and item.get("tensors"):
                self.answer_bytes = 0  # an answer inline
            return item
        size = shm.get("size") if isinstance(shm, dict) else None
        if type(size) is int and size >= OFF_LOOP_BYTES:
            return await run_off_loop(functools.partial(self.receive, item))
        return self.receive(item)

    def receive(self, item: Any) -> Any:
        """An answer as the rest of the door reads it: its region's tensors read back into
        `bytes`, and the region unlinked. RegionError for a region that is not as it says."""
        shm = item.get("shm") if isinstance(item, dict) else None
        if shm is None:
            return item
        name = shm.get("region") if isinstance(shm, dict) else None
        size = shm.get("size") if isinstance(shm, dict) else None
        if type(size) is not int or size <= 0:
            raise RegionError(f"an answer gives shared memory region {name!r} a size of {size!r}")
        reply = self._reply
        if reply is not None and name == reply.name:  # the region offered, read once
            if size != reply.size:
                raise RegionError(f"an answer gives shared memory region '{name}' a size of {size}")
            self._reply = None
            tensors = [self._read(reply.fd, name, size, t) for t in item.get("tensors", ())]
        elif isinstance(name, str) and name.startswith(self.prefix + "o"):
            try:
                fd = shm_regions.open_sized(name, size)
                try:
                    tensors = [self._read(fd, name, size, t) for t in item.get("tensors", ())]
                finally:
                    os.close(fd)
            finally:
                shm_regions.unlink(name)
        else:
            raise RegionError(f"an answer names the shared memory region {name!r}, not its own")
        self.answer_bytes = max(
            self.answer_bytes or 0,
            sum(len(t["data"]["values"]) for t in tensors if "values" in t.get("data", ())),
        )
        out = {key: value for key, value in item.items() if key != "shm"}
        out["tensors"] = tensors
        return out

    @staticmethod
    def _read(fd: int, name: str, size: int, tensor: dict) -> dict:
        data = tensor.get("data")
        if not isinstance(data, dict) or data.get("shm") is None:
            return tensor
        span = data["shm"]
        offset, length = shm_regions.check_span(name, size, span)
        values = os.pread(fd, length, offset)
        if len(values) != length:  # truncated meanwhile
            raise RegionError(f"shared memory region '{name}' shrank while it was read")
        return {
            "metadata": tensor["metadata"],
            "data": {"data_type": data.get("data_type"), "values": values},
        }

    def _close_inputs(self) -> None:
        if self._inputs is not None:
            name, made = self._inputs
            shm_regions.unlink(name)
            self._door._input_objects.discard(made)
            self._inputs = None

    def close(self, answered: bool) -> None:
        """The request is over: its pooled regions go back to the pool, its inputs' own region
        goes, and unless it ended with its final answer (`answered`), every answer region the
        worker may have made for it."""
        for region in self._pooled:
            self._door.pool.give_back(region)
        self._pooled.clear()
        self._reply = None
        self._close_inputs()
        if not answered:
            for name in shm_regions.names():
                if name.startswith(self.prefix + "o"):
                    shm_regions.unlink(name)
        self._door._in_flight.discard(self.token)


# -- the worker's side --------------------------------------------------------------------------


def open_inputs(request: dict) -> OutputPlacer | None:
    """A request in the shared memory form, made ready for the codec: every placed input's
    `values` becomes a view of the (copy-on-write) mapped region. None for a request not in
    that form; else the OutputPlacer its answers use. RequestError (INTERNAL) for a region that
    is not as the request says, or one from another host; one not beginning with REFUSED for a
    pooled region given to another request since (this request is one the door gave up)."""
    shm = request.get("shm")
    if shm is None:
        return None
    if not isinstance(shm, dict):
        raise _failure("malformed shared memory request")
    host = host_id()
    if not host or shm.get("host") != host:
        raise _failure("a shared memory request reached a worker on another host")
    prefix = shm.get("prefix")
    threshold = shm.get("threshold")
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix) or type(threshold) is not int:
        raise _failure(f"malformed shared memory request (prefix {prefix!r})")
    door = prefix[: prefix.rindex("-", 0, -1) + 1]  # `dynbridge-<ns>-<door pid>-`
    name = shm.get("region")
    if name is not None:
        size = shm.get("size")
        pooled = _is_pooled(name, door)
        if not (pooled or name == prefix + "i") or type(size) is not int or size <= 0:
            raise _failure(f"malformed shared memory request (region {name!r}, size {size!r})")
        try:
            fd = shm_regions.open_sized(name, size)
            try:
                if pooled:  # held until the last view of the mapping goes
                    shm_regions.hold(fd, name, shm.get("generation"))
                view = memoryview(shm_regions.map_private(fd, size))
            finally:
                os.close(fd)
            for tensor in request.get("tensors", ()):
                data = tensor.get("data") if isinstance(tensor, dict) else None
                if isinstance(data, dict) and data.get("shm") is not None:
                    offset, length = shm_regions.check_span(name, size, data["shm"])
                    data["values"] = view[offset : offset + length]
        except StaleRegion as exc:
            raise RequestError(str(exc), ErrorCode.INTERNAL) from None
        except (RegionError, OSError) as exc:
            raise _failure(str(exc)) from None
    return OutputPlacer(prefix, max(threshold, 1), _offered(shm.get("reply"), door))


def _is_pooled(name: object, door: str) -> TypeGuard[str]:
    """Is `name` one of the pooled regions of the door whose names begin with `door`?"""
    if not isinstance(name, str) or not name.startswith(door):
        return False
    parsed = shm_regions.parse(name)
    return parsed is not None and parsed[3] == POOLED


class _Reply(NamedTuple):
    name: str
    size: int
    generation: int


def _offered(reply: object, door: str) -> _Reply | None:
    """The pooled region a request offers for an answer; None if none, or not as it must be
    (the answers then use regions of their own)."""
    if not isinstance(reply, dict):
        return None
    name, size, generation = reply.get("region"), reply.get("size"), reply.get("generation")
    if not _is_pooled(name, door) or type(size) is not int or type(generation) is not int:
        return None
    return _Reply(name, size, generation)


class OutputPlacer:
    """Puts one request's large outputs in regions the door reads (on the model's thread): the
    region the door offered, for the first answer that fits in it, else one of their own."""

    __slots__ = ("prefix", "threshold", "_count", "_reply")

    def __init__(self, prefix: str, threshold: int, reply: _Reply | None = None) -> None:
        self.prefix = prefix
        self.threshold = threshold
        self._count = itertools.count()
        # Taken by one answer (list.pop is atomic: a decoupled model's answers may come from
        # several threads).
        self._reply: list[_Reply] = [reply] if reply is not None else []

    def place(self, tensors: Sequence[Tensor]) -> tuple[list[dict[str, Any]], dict | None]:
        """The answer's tensor dicts, and its `shm` entry (None: every tensor inline)."""
        contents: list[Any] = []
        placed: set[int] = set()
        size = 0
        for index, tensor in enumerate(tensors):
            data = raw_contents(tensor) if tensor._datatype == "BYTES" else raw_array(tensor)
            contents.append(data)
            length = len(data) if isinstance(data, bytes | bytearray) else data.nbytes
            if length >= self.threshold:
                placed.add(index)
                size = _aligned(size + length)
        if not placed:
            return [_inline(t, data) for t, data in zip(tensors, contents, strict=True)], None
        answer = self._into_reply(tensors, contents, placed, size)
        if answer is not None:
            return answer
        name = f"{self.prefix}o{next(self._count)}"
        try:
            fd = shm_regions.create(name, size)
        except OSError as exc:  # /dev/shm full or refused: the bytes form still works
            log.warning("outputs sent inline: shared memory region '%s': %s", name, exc)
            return [encode_raw_tensor(t) for t in tensors], None
        try:
            out = _write(fd, 0, tensors, contents, placed)
        except OSError as exc:
            shm_regions.unlink(name)
            log.warning("outputs sent inline: shared memory region '%s': %s", name, exc)
            return [encode_raw_tensor(t) for t in tensors], None
        finally:
            os.close(fd)
        return out, {"region": name, "size": size}

    def _into_reply(
        self, tensors: Sequence[Tensor], contents: list[Any], placed: set[int], size: int
    ) -> tuple[list[dict[str, Any]], dict] | None:
        """The answer written into the offered region, if there is one it fits in and it is
        still this request's (else None: the caller makes a region of its own)."""
        try:
            reply = self._reply.pop()
        except IndexError:
            return None
        if HEADER + size > reply.size:
            return None
        try:
            fd = shm_regions.open_sized(reply.name, reply.size, writable=True)
        except (RegionError, OSError):
            return None
        try:  # the shared lock keeps the door from giving the region to another request
            shm_regions.hold(fd, reply.name, reply.generation)
            out = _write(fd, HEADER, tensors, contents, placed)
        except (RegionError, OSError) as exc:
            log.debug("an answer not in the offered region '%s': %s", reply.name, exc)
            return None
        finally:
            os.close(fd)
        return out, {"region": reply.name, "size": reply.size}


def _write(
    fd: int, base: int, tensors: Sequence[Tensor], contents: list[Any], placed: set[int]
) -> list[dict[str, Any]]:
    """The answer's tensor dicts, the `placed` ones written into region `fd` from `base` on."""
    out: list[dict[str, Any]] = []
    offset = base
    for index, tensor in enumerate(tensors):
        data = contents[index]
        if index not in placed:
            out.append(_inline(tensor, data))
            continue
        buffer = memoryview(data).cast("B")
        shm_regions.write(fd, buffer, offset)
        out.append(_spanned(tensor, offset, len(buffer)))
        offset = _aligned(offset + len(buffer))
    return out


def _metadata(tensor: Tensor) -> tuple[dict[str, Any], str]:
    dynamo_type = TO_DYNAMO[tensor._datatype]
    shape = list(tensor._array.shape)
    return {"name": tensor._name, "data_type": dynamo_type, "shape": shape}, dynamo_type


def _inline(tensor: Tensor, data: Any) -> dict[str, Any]:
    metadata, dynamo_type = _metadata(tensor)
    # inline: it crosses the request plane, whose msgpack takes `bytes` only
    values = bytes(data) if isinstance(data, bytearray) else data
    values = values if isinstance(values, bytes) else values.tobytes()
    return {"metadata": metadata, "data": {"data_type": dynamo_type, "values": values}}


def _spanned(tensor: Tensor, offset: int, length: int) -> dict[str, Any]:
    metadata, dynamo_type = _metadata(tensor)
    return {"metadata": metadata, "data": {"data_type": dynamo_type, "shm": [offset, length]}}
