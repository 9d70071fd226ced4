"""Schedulers: which requests an instance's `execute` receives, and when.

`build_scheduler` picks Triton's scheduler for a config: the sequence batcher when
`sequence_batching` is set, the dynamic batcher when `dynamic_batching` is set, else the default
scheduler (each request alone on the next free instance). Every scheduler offers
`enqueue(pending, priority=0)`, `drain(timeout)` and `close(unavailable)`, and records into a
`ModelStats`. Each takes a cancelled request out of its queue at once (answered CANCELLED), fails a
batch whose run raised instead of losing the instance, and once closed answers whatever it still
holds, and every later request, UNAVAILABLE.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tritonclient.grpc import model_config_pb2 as mc

from ..execution import Pending
from ..instance import Instance
from .default import DefaultScheduler
from .dynamic import DynamicBatcher
from .entry import RunBatch
from .sequence import SequenceBatcher
from .stacking import STACK_KEY, stacking_enabled
from .stats import ModelStats

__all__ = [
    "STACK_KEY",
    "DefaultScheduler",
    "DynamicBatcher",
    "ModelStats",
    "Scheduler",
    "SequenceBatcher",
    "build_scheduler",
]


class Scheduler(Protocol):
    def enqueue(self, pending: Pending, priority: int = 0) -> None: ...

    def drain(self, timeout: float | None = None) -> bool: ...

    def close(self, unavailable: str) -> None: ...


def build_scheduler(
    config: mc.ModelConfig,
    instances: Sequence[Instance],
    run_batch: RunBatch,
    stats: ModelStats,
) -> Scheduler:
    """The scheduler Triton would use for `config`."""
    if config.HasField("sequence_batching"):
        return SequenceBatcher(config, instances, run_batch, stats)
    if config.HasField("dynamic_batching"):
        return DynamicBatcher(config, instances, run_batch, stats, stack=stacking_enabled(config))
    return DefaultScheduler(instances, run_batch, stats)
