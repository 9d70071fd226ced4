"""Schedulers: which requests an instance's `execute` receives, and when.

`build_scheduler` picks Triton's scheduler for a config: the sequence batcher when
`sequence_batching` is set, the dynamic batcher when `dynamic_batching` is set, else the default
scheduler (each request alone on the next free instance). Every scheduler offers
`enqueue(pending, priority=0)`, `drain(timeout)` and `close()`, and records into a `ModelStats`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tritonclient.grpc import model_config_pb2 as mc

from ..execution import Pending
from ..instance import ModelInstance
from .default import DefaultScheduler
from .dynamic import DynamicBatcher
from .entry import Entry, RunBatch, batch_size_of, drop_if_cancelled, observe, run_timed
from .sequence import SequenceBatcher
from .stacking import STACK_KEY, stacking_enabled
from .stats import ModelStats

__all__ = [
    "STACK_KEY",
    "DefaultBatcher",
    "DynamicBatcher",
    "ModelStats",
    "Scheduler",
    "SequenceBatcher",
    "build_scheduler",
]


class Scheduler(Protocol):
    def enqueue(self, pending: Pending, priority: int = 0) -> None: ...

    def drain(self, timeout: float | None = None) -> bool: ...

    def close(self) -> None: ...


class DefaultBatcher:
    """The default scheduler with statistics: each request alone, on the next free instance."""

    def __init__(
        self,
        config: mc.ModelConfig,
        instances: Sequence[ModelInstance],
        run_batch: RunBatch,
        stats: ModelStats,
    ) -> None:
        self._batching = config.max_batch_size > 0
        self._stats = stats
        self._run_batch = run_batch
        self._scheduler: DefaultScheduler[Entry] = DefaultScheduler(instances, self._run)

    def enqueue(self, pending: Pending, priority: int = 0) -> None:
        entry = Entry(pending, batch_size_of(pending.request, self._batching), priority=priority)
        observe(entry, self._stats)
        self._scheduler.enqueue(entry)

    def _run(self, instance: ModelInstance, entries: list[Entry]) -> None:
        live = [e for e in entries if not drop_if_cancelled(e)]
        if live:
            run_timed(self._run_batch, instance, live, self._stats)

    def drain(self, timeout: float | None = None) -> bool:
        return self._scheduler.drain(timeout)

    def close(self) -> None:
        return None


def build_scheduler(
    config: mc.ModelConfig,
    instances: Sequence[ModelInstance],
    run_batch: RunBatch,
    stats: ModelStats,
) -> Scheduler:
    """The scheduler Triton would use for `config`."""
    if config.HasField("sequence_batching"):
        return SequenceBatcher(config, instances, run_batch, stats)
    if config.HasField("dynamic_batching"):
        return DynamicBatcher(config, instances, run_batch, stats, stack=stacking_enabled(config))
    return DefaultBatcher(config, instances, run_batch, stats)
