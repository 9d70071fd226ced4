"""The dynamic batcher's queue: priority levels, each with Triton's queue policy.

Levels are served lowest number first; inside a level, requests in arrival order, then the ones
whose timeout passed under a DELAY policy. A request's priority 0, or one above
`priority_levels`, means `default_priority_level` [V]. A timeout is the policy's
`default_timeout_microseconds`; with `allow_timeout_override` a request's own `timeout` may
shorten it but never lengthen it [V: a 2 s request timeout under a 200 ms default expired].
`max_queue_size` counts the requests still waiting at that level.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from tritonclient.grpc import model_config_pb2 as mc

from .entry import Entry

QUEUE_FULL = "Exceeds maximum queue size"
TIMEOUT_EXPIRED = "Request timeout expired"


class QueueFull(Exception):
    """The request's priority level already holds `max_queue_size` requests."""


class _Level:
    __slots__ = ("policy", "waiting", "delayed")

    def __init__(self, policy: mc.ModelQueuePolicy) -> None:
        self.policy = policy
        self.waiting: deque[Entry] = deque()
        self.delayed: deque[Entry] = deque()

    def __len__(self) -> int:
        return len(self.waiting) + len(self.delayed)

    def timeout_us(self, requested_us: int) -> int:
        timeout = self.policy.default_timeout_microseconds
        if self.policy.allow_timeout_override and requested_us and requested_us < timeout:
            timeout = requested_us
        return timeout


class PriorityQueues:
    """Every queued request of one dynamic batcher, in the order Triton serves them."""

    def __init__(self, batching: mc.ModelDynamicBatching) -> None:
        self._levels_count = batching.priority_levels
        self._default_level = batching.default_priority_level if self._levels_count else 0
        if self._levels_count == 0:
            self._levels = {0: _Level(batching.default_queue_policy)}
        else:
            self._levels = {
                level: _Level(
                    batching.priority_queue_policy.get(level, batching.default_queue_policy)
                )
                for level in range(1, self._levels_count + 1)
            }
        # Triton forms the next batch while every instance is busy (and lets it grow) only for
        # a plain queue; with timeouts, a size limit or priorities requests wait in the queue,
        # where the policy can still act on them [V].
        self.prefetch = self._levels_count <= 1 and all(
            level.policy.default_timeout_microseconds == 0 and level.policy.max_queue_size == 0
            for level in self._levels.values()
        )

    def __len__(self) -> int:
        return sum(len(level) for level in self._levels.values())

    def level_of(self, priority: int) -> int:
        if self._levels_count == 0:
            return 0
        if priority <= 0 or priority > self._levels_count:
            return self._default_level
        return priority

    def push(self, entry: Entry, request_timeout_us: int, now_ns: int) -> None:
        """Queue `entry` at its level; raises QueueFull when that level is full."""
        level = self._levels[self.level_of(entry.priority)]
        limit = level.policy.max_queue_size
        if limit and len(level) >= limit:
            raise QueueFull(QUEUE_FULL)
        timeout = level.timeout_us(request_timeout_us)
        entry.deadline_ns = now_ns + timeout * 1000 if timeout else 0
        level.waiting.append(entry)

    def __iter__(self) -> Iterator[Entry]:
        for _, level in sorted(self._levels.items()):
            yield from level.waiting
            yield from level.delayed

    def take(self, count: int) -> list[Entry]:
        """Remove and return the first `count` entries in serving order."""
        taken: list[Entry] = []
        for _, level in sorted(self._levels.items()):
            for queue in (level.waiting, level.delayed):
                while queue and len(taken) < count:
                    taken.append(queue.popleft())
        return taken

    def remove(self, entry: Entry) -> bool:
        """Take `entry` out of the queue (a cancelled request); False if it is not queued."""
        level = self._levels[self.level_of(entry.priority)]
        for queue in (level.waiting, level.delayed):
            try:
                queue.remove(entry)
            except ValueError:
                continue
            return True
        return False

    def expire(self, now_ns: int) -> list[Entry]:
        """Apply the policy to requests past their deadline; returns the rejected ones."""
        rejected: list[Entry] = []
        for level in self._levels.values():
            if not any(e.deadline_ns and e.deadline_ns <= now_ns for e in level.waiting):
                continue
            kept: deque[Entry] = deque()
            for entry in level.waiting:
                if not entry.deadline_ns or entry.deadline_ns > now_ns:
                    kept.append(entry)
                elif level.policy.timeout_action == mc.ModelQueuePolicy.DELAY:
                    entry.deadline_ns = 0
                    level.delayed.append(entry)
                else:
                    rejected.append(entry)
            level.waiting = kept
        return rejected

    def next_deadline(self) -> int:
        """The earliest pending deadline (monotonic ns), 0 if none."""
        deadlines = [
            e.deadline_ns for level in self._levels.values() for e in level.waiting if e.deadline_ns
        ]
        return min(deadlines, default=0)
