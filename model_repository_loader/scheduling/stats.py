"""Per model-version statistics, shaped like Triton's `ModelStatistics` (spec §3.15).

The schedulers record into a `ModelStats`; a metrics or statistics endpoint reads `snapshot()`.
Durations are nanoseconds, as in Triton. `inference_count` sums the batch sizes of successful
requests, `execution_count` counts `execute` calls, and `batch_stats` is keyed by the summed batch
size of one `execute` call.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass(slots=True)
class Duration:
    """How many times something happened and how long it took in total."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns


@dataclass(slots=True)
class BatchStats:
    """What the `execute` calls of one batch size cost."""

    batch_size: int
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(slots=True)
class StatsSnapshot:
    last_inference_ms: int
    inference_count: int
    execution_count: int
    success: Duration
    fail: Duration
    queue: Duration
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration
    batch_stats: list[BatchStats]


class ModelStats:
    """Counters for one model version; every method is thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_inference_ms = 0
        self._inference_count = 0
        self._execution_count = 0
        self._success = Duration()
        self._fail = Duration()
        self._queue = Duration()
        self._compute_input = Duration()
        self._compute_infer = Duration()
        self._compute_output = Duration()
        self._batches: dict[int, BatchStats] = {}

    def record_request(self, ok: bool, batch_size: int, duration_ns: int) -> None:
        """A request got its final response: `duration_ns` from arrival to that response."""
        with self._lock:
            self._last_inference_ms = time.time_ns() // 1_000_000
            if ok:
                self._success.add(duration_ns)
                self._inference_count += batch_size
            else:
                self._fail.add(duration_ns)

    def record_execution(
        self,
        batch_size: int,
        requests: int,
        queue_ns: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
    ) -> None:
        """One `execute` call over `requests` requests whose batch sizes sum to `batch_size`.

        `queue_ns` is the summed time those requests waited in the queue, `input_ns` the time
        spent preparing the call's inputs (e.g. stacking), `infer_ns` the time inside
        `execute`, `output_ns` the time spent splitting outputs back. Each request of the call is
        counted with the call's durations, as Triton counts them.
        """
        with self._lock:
            self._queue.add(queue_ns, requests)
            self._execution_count += 1
            self._compute_input.add(input_ns * requests, requests)
            self._compute_infer.add(infer_ns * requests, requests)
            self._compute_output.add(output_ns * requests, requests)
            stats = self._batches.get(batch_size)
            if stats is None:
                stats = self._batches[batch_size] = BatchStats(batch_size)
            stats.compute_input.add(input_ns)
            stats.compute_infer.add(infer_ns)
            stats.compute_output.add(output_ns)

    def snapshot(self) -> StatsSnapshot:
        """A consistent copy of every counter."""

        def copy(d: Duration) -> Duration:
            return Duration(d.count, d.ns)

        with self._lock:
            return StatsSnapshot(
                last_inference_ms=self._last_inference_ms,
                inference_count=self._inference_count,
                execution_count=self._execution_count,
                success=copy(self._success),
                fail=copy(self._fail),
                queue=copy(self._queue),
                compute_input=copy(self._compute_input),
                compute_infer=copy(self._compute_infer),
                compute_output=copy(self._compute_output),
                batch_stats=[
                    BatchStats(
                        b.batch_size,
                        copy(b.compute_input),
                        copy(b.compute_infer),
                        copy(b.compute_output),
                    )
                    for _, b in sorted(self._batches.items())
                ],
            )
