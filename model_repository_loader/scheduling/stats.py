"""Per model-version statistics, shaped like Triton's `ModelStatistics` (spec §3.15).

The schedulers record into a `ModelStats`; a metrics or statistics endpoint reads `snapshot()`.
Durations are nanoseconds, as in Triton. `inference_count` sums the batch sizes of successful
requests, `execution_count` counts `execute` calls, and `batch_stats` is keyed by the summed batch
size of one `execute` call.

For Triton's Prometheus metrics the stats also keep: failures by Triton's reason (`REJECTED`,
`CANCELED`, `BACKEND`, `OTHER`), the number of requests waiting in the queue (`queued`, a gauge),
and the latest per-request latencies (`recent`, a bounded window for quantile summaries).

With the response cache, a hit counts as a success with its request and queue time and a
`cache_hit` (the lookup), and touches neither `inference_count`, `execution_count` nor
`last_inference`; a miss adds its lookup and insert time to `cache_miss` and to the request's
duration, as Triton 2.51 counts them [V].
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

# Triton's failure reasons (label `reason` of nv_inference_request_failure) [V on 2.51].
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
# Buckets (ms) of the time to a request's first response, Triton's first-response histogram.
# Triton 2.51 has no such histogram; these are the defaults later releases document
# (unverified against an oracle).
FIRST_RESPONSE_BUCKETS_MS = (100.0, 500.0, 2000.0, 5000.0)
# Latency samples kept per kind for quantiles: enough for a scrape interval of a busy model,
# small enough to sort at scrape time. Kinds: request, queue, compute_input/infer/output.
RECENT_SAMPLES = 4096


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
    failures: dict[str, int] = field(default_factory=dict)  # by reason; every reason present
    queued: int = 0
    # Time to first response: per FIRST_RESPONSE_BUCKETS_MS bucket (+Inf last, not cumulative).
    first_response: Duration = field(default_factory=Duration)
    first_response_buckets: list[int] = field(default_factory=list)
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)


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
        self._failures = dict.fromkeys(FAILURE_REASONS, 0)
        self._queued = 0
        self._first = Duration()
        self._first_buckets = [0] * (len(FIRST_RESPONSE_BUCKETS_MS) + 1)
        self._cache_hit = Duration()
        self._cache_miss = Duration()
        # (monotonic ns when recorded, duration ns) per latency kind, newest last.
        self.recent: dict[str, deque[tuple[int, int]]] = {
            kind: deque(maxlen=RECENT_SAMPLES)
            for kind in ("request", "queue", "compute_input", "compute_infer", "compute_output")
        }

    def record_request(
        self,
        ok: bool,
        batch_size: int,
        duration_ns: int,
        reason: str = "BACKEND",
        touch_last: bool = True,
    ) -> None:
        """A request got its final response: `duration_ns` from arrival to that response.

        A failed request counts under `reason`, one of FAILURE_REASONS. `touch_last` False
        leaves `last_inference` as it was (an ensemble's failure does not set it [V]).
        """
        now = time.monotonic_ns()
        with self._lock:
            if touch_last:
                self._last_inference_ms = time.time_ns() // 1_000_000
            if ok:
                self._success.add(duration_ns)
                self._inference_count += batch_size
                self.recent["request"].append((now, duration_ns))
            else:
                self._fail.add(duration_ns)
                self._failures[reason if reason in self._failures else "OTHER"] += 1

    def record_cache_hit(self, duration_ns: int, queue_ns: int, lookup_ns: int) -> None:
        """A request answered from the response cache, `duration_ns` after its arrival."""
        now = time.monotonic_ns()
        with self._lock:
            self._success.add(duration_ns)
            self._queue.add(queue_ns)
            self._cache_hit.add(lookup_ns)
            self.recent["request"].append((now, duration_ns))
            self.recent["queue"].append((now, queue_ns))

    def record_cache_miss(self, duration_ns: int) -> None:
        """A request that missed the cache was answered: its lookup and insert took this long."""
        with self._lock:
            self._success.ns += duration_ns
            self._cache_miss.add(duration_ns)

    def record_first_response(self, duration_ns: int) -> None:
        """A request's first response (final or not) left `duration_ns` after its arrival."""
        ms = duration_ns / 1e6
        index = next(
            (i for i, bound in enumerate(FIRST_RESPONSE_BUCKETS_MS) if ms <= bound),
            len(FIRST_RESPONSE_BUCKETS_MS),
        )
        with self._lock:
            self._first.add(duration_ns)
            self._first_buckets[index] += 1

    def queue_changed(self, delta: int) -> None:
        """`delta` requests entered (+) or left (-) the scheduler's queue."""
        with self._lock:
            self._queued += delta

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
            now = time.monotonic_ns()
            each_queue = queue_ns // requests if requests else 0
            for kind, ns in (
                ("queue", each_queue),
                ("compute_input", input_ns),
                ("compute_infer", infer_ns),
                ("compute_output", output_ns),
            ):
                window = self.recent[kind]
                for _ in range(requests):
                    window.append((now, ns))

    def recent_values(self, kind: str, since_ns: int) -> list[int]:
        """The latencies of `kind` recorded at or after monotonic `since_ns`, in ns."""
        with self._lock:
            return [ns for at, ns in self.recent[kind] if at >= since_ns]

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
                failures=dict(self._failures),
                queued=self._queued,
                first_response=copy(self._first),
                first_response_buckets=list(self._first_buckets),
                cache_hit=copy(self._cache_hit),
                cache_miss=copy(self._cache_miss),
            )
