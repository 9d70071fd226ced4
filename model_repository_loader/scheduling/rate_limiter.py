"""Triton's rate limiter: an instance runs `execute` only while the resources its instance group
asks for are free, across every model of one loaded repository (`--rate-limit
execution_count`; with `--rate-limit off`, Triton's default, there is no limiter at all and
`rate_limiter` blocks are neither checked nor used).

Facts carried over from Triton's core (src/rate_limiter.cc) and user guide (rate_limiter.md):
- A resource is counted per device (the instance's device; CPU instances are on device 0) unless
  the instance group marks it `global`, then once for the whole server. The same name may not
  be both: "Resource "<r>" is present as both global and device-specific resource in the model
  configuration." (INVALID_ARG, a load error).
- The server's count of a resource is the largest count any registered instance asks for.
  Once any `--rate-limit-resource` is given, the flags decide instead: a device resource gets
  the largest of `<name>:<count>:<that device>` and `<name>:<count>` (every device), a global
  one the largest given for its name on any device, and a resource no flag names has 0. A count
  below what an instance asks for is a load error: "Resource count for "<r>" is limited to <n>
  which will prevent scheduling of one or more model instances, the minimum required count is
  <m>" [V on 2.51, with the "Invalid argument: " prefix of the load reason].
- Waiting instances form one queue ordered by `execution count × max(priority, 1)`, lowest
  first (`priority` is a weight: an instance of priority 2 gets half the turns of one of
  priority 1 under contention). Only the head of that queue is tried: an instance that cannot
  have its resources holds back the ones behind it, as in Triton. Triton's `std::priority_queue`
  breaks ties by its heap layout; here a tie goes to the instance that started waiting first.
  Where Triton grants one waiting instance per release, this grants as long as the head fits,
  so a free resource is never left idle behind a satisfied head (the order is the same).
- The execution count goes up when an execution releases its resources.

The waiting happens on the instance's own thread (never on an event loop), and the resources are
held for exactly one `execute` call: `hold()` releases them on every way out of it, an
exception, an isolated process dying or a cancelled request included. Unregistering an
instance (its version closing or failing to load) frees what it holds and wakes it if it waits,
with `Withdrawn`.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from ..errors import ErrorCode, TritonStatusError

# Where a resource is counted: a device id, or GLOBAL for a resource shared by all devices.
GLOBAL = "global"
Place = int | str
Needs = dict[Place, dict[str, int]]

# `--rate-limit` values (Triton's names).
MODES = ("execution_count", "off")

# How long the last `hold()` on this thread waited for its resources (see `take_wait_ns`).
_waited = threading.local()


def take_wait_ns() -> int:
    """Nanoseconds the last `execute` on this thread waited for its resources, once (0 after).

    Triton counts that wait as queue time (a request is queued until its execution starts);
    the scheduler that ran the batch moves it there from compute time.
    """
    waited: int = getattr(_waited, "ns", 0)
    _waited.ns = 0
    return waited


@dataclass(frozen=True, slots=True)
class ResourceLimit:
    """One `--rate-limit-resource name:count[:device]`; `device` None applies to every device."""

    name: str
    count: int
    device: int | None = None


def parse_resource_limit(text: str) -> ResourceLimit:
    """`name:count` or `name:count:device`, as tritonserver reads the flag; ValueError with
    tritonserver's text otherwise."""
    error = (
        "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
        f"'<resource_name>:<count>'. Got {text}"
    )
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(error)
    try:
        count = int(parts[1])
        device = int(parts[2]) if len(parts) == 3 else None
    except ValueError:
        raise ValueError(error) from None
    return ResourceLimit(parts[0], count, device)


class Withdrawn(TritonStatusError):
    """The instance was unregistered (its version is closing) while it waited."""

    default_code = ErrorCode.UNAVAILABLE


class LimitedInstance:
    """One registered instance: `hold()` around each `execute`."""

    def __init__(self, limiter: RateLimiter, name: str, needs: Needs, priority: int) -> None:
        self.name = name
        self.needs = needs
        self.weight = max(priority, 1)
        self.executions = 0
        self._limiter = limiter

    @property
    def scaled_priority(self) -> int:
        return self.executions * self.weight

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Wait (on this thread) until this instance has its resources; free them after."""
        start = time.monotonic_ns()
        self._limiter.acquire(self)
        _waited.ns = time.monotonic_ns() - start
        try:
            yield
        finally:
            self._limiter.release(self)

    def unregister(self) -> None:
        self._limiter.unregister(self)


class RateLimiter:
    """The resources of one loaded repository and the instances that wait for them."""

    def __init__(self, explicit: Sequence[ResourceLimit] = ()) -> None:
        self._explicit = tuple(explicit)
        self._registered: set[LimitedInstance] = set()
        self._available: Needs = {}
        self._allocated: Needs = {}
        # Waiting instances → the order they started waiting in (the tie-break).
        self._waiting: dict[LimitedInstance, int] = {}
        self._granted: set[LimitedInstance] = set()
        self._arrivals = itertools.count()
        self._changed = threading.Condition()

    # -- registration (model load and unload) ------------------------------------------------

    def register(self, name: str, group: mc.ModelInstanceGroup, device_id: int) -> LimitedInstance:
        """Add an instance of `group` on `device_id`; TritonStatusError (INVALID_ARG, Triton's
        text) if the server's resources could never run it."""
        needs: Needs = {}
        for resource in group.rate_limiter.resources:
            # `global` is a Python keyword: the field is only reachable by name.
            place: Place = GLOBAL if getattr(resource, "global") else device_id
            needs.setdefault(place, {})[resource.name] = resource.count
        instance = LimitedInstance(self, name, needs, group.rate_limiter.priority)
        with self._changed:
            registered = self._registered | {instance}
            self._available = self._limits(registered)  # raises before anything changed
            self._registered = registered
        return instance

    def unregister(self, instance: LimitedInstance) -> None:
        """Forget `instance`: free what it holds, wake it if it waits (Withdrawn)."""
        with self._changed:
            if instance not in self._registered:
                return
            self._registered.discard(instance)
            if instance in self._granted:
                self._granted.discard(instance)
                self._free(instance)
            self._waiting.pop(instance, None)
            self._available = self._limits(self._registered)
            self._grant()
            self._changed.notify_all()

    def _limits(self, instances: set[LimitedInstance]) -> Needs:
        """The count of each resource on each place, by Triton's rule (module doc)."""
        largest: Needs = {}
        for instance in instances:
            for place, needs in instance.needs.items():
                counts = largest.setdefault(place, {})
                for name, count in needs.items():
                    counts[name] = max(counts.get(name, 0), count)
        for name in largest.get(GLOBAL, {}):
            if any(name in counts for place, counts in largest.items() if place != GLOBAL):
                raise TritonStatusError(
                    f'Resource "{name}" is present as both global and device-specific resource '
                    "in the model configuration.",
                    ErrorCode.INVALID_ARG,
                )
        if not self._explicit:
            return largest
        for place, counts in largest.items():
            for name, needed in counts.items():
                given = [
                    limit.count
                    for limit in self._explicit
                    if limit.name == name
                    and (place == GLOBAL or limit.device is None or limit.device == place)
                ]
                count = max(given, default=0)
                if count < needed:
                    raise TritonStatusError(
                        f'Resource count for "{name}" is limited to {count} which will prevent '
                        "scheduling of one or more model instances, the minimum required count "
                        f"is {needed}",
                        ErrorCode.INVALID_ARG,
                    )
                counts[name] = count
        return largest

    # -- execution ---------------------------------------------------------------------------

    def acquire(self, instance: LimitedInstance) -> None:
        with self._changed:
            if instance not in self._registered:
                raise Withdrawn(f"instance '{instance.name}' is no longer served")
            self._waiting[instance] = next(self._arrivals)
            self._grant()
            while instance not in self._granted:
                if instance not in self._registered:
                    raise Withdrawn(f"instance '{instance.name}' is no longer served")
                self._changed.wait()

    def release(self, instance: LimitedInstance) -> None:
        with self._changed:
            instance.executions += 1
            if instance in self._granted:
                self._granted.discard(instance)
                self._free(instance)
                self._grant()
                self._changed.notify_all()

    def _grant(self) -> None:
        """Give the head of the waiting queue its resources, as long as they are free."""
        granted = False
        while self._waiting:
            head = min(self._waiting, key=lambda i: (i.scaled_priority, self._waiting[i]))
            if not self._fits(head):
                break
            del self._waiting[head]
            for place, needs in head.needs.items():
                allocated = self._allocated.setdefault(place, {})
                for name, count in needs.items():
                    allocated[name] = allocated.get(name, 0) + count
            self._granted.add(head)
            granted = True
        if granted:
            self._changed.notify_all()

    def _fits(self, instance: LimitedInstance) -> bool:
        for place, needs in instance.needs.items():
            available = self._available.get(place, {})
            allocated = self._allocated.get(place, {})
            for name, count in needs.items():
                if allocated.get(name, 0) + count > available.get(name, 0):
                    return False
        return True

    def _free(self, instance: LimitedInstance) -> None:
        for place, needs in instance.needs.items():
            allocated = self._allocated.get(place, {})
            for name, count in needs.items():
                allocated[name] = allocated.get(name, 0) - count

    def waiting(self) -> int:
        """How many instances wait for their resources now."""
        with self._changed:
            return len(self._waiting)
