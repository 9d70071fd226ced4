"""Triton's per-model Prometheus metrics (`nv_inference_*`), rendered from the loader's statistics.

Names, types, HELP texts, label order and number formats are the ones Triton 2.51 serves on its
metrics port [V]: counters in whole microseconds, labels `model` and `version`, failures split by
`reason` (REJECTED, CANCELED, BACKEND, OTHER; a model's own error response counts as a success,
an exception in `execute` as BACKEND), and the `nv_inference_pending_request_count` gauge.
With `summary_latencies=true` the `*_summary_us` families add quantiles 0.5/0.9/0.95/0.99/0.999
over the last 60 s, as Triton's defaults; their `_count` and `_sum` match the counters.
With `histogram_latencies=true`, decoupled models get `nv_inference_first_response_histogram_ms`
(time to a request's first response). Triton 2.51 accepts the setting and shows nothing [V];
the family, decoupled-only, is that of later releases, and its default buckets
(FIRST_RESPONSE_BUCKETS_MS) are not verified against an oracle.

With a response cache (`--cache-config`), models whose config enables it get Triton's per-model
`nv_cache_*_per_model` counters, and the cache its `nv_cache_*` gauges (entries, hits, misses,
lookups, evictions, utilization, lookup and insertion time in µs) [V: names, types, HELP].
Triton refreshes those gauges on its metrics interval; here they are read at each scrape.

The renderer holds no registry of its own: it reads the models it is given at each scrape, so a
model that unloads is gone from the next scrape and a reloaded one starts again from zero.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from model_repository_loader.response_cache import CacheCounters, ResponseCache
from model_repository_loader.scheduling.stats import (
    FAILURE_REASONS,
    FIRST_RESPONSE_BUCKETS_MS,
    ModelStats,
    StatsSnapshot,
)

# prometheus-cpp's Summary defaults as Triton uses them: a 60 s sliding window.
SUMMARY_QUANTILES = (0.5, 0.9, 0.95, 0.99, 0.999)
SUMMARY_WINDOW_S = 60.0

_COUNTERS: tuple[tuple[str, str, Callable[[StatsSnapshot], int]], ...] = (
    (
        "nv_inference_count",
        "Number of inferences performed (does not include cached requests)",
        lambda s: s.inference_count,
    ),
    (
        "nv_inference_exec_count",
        "Number of model executions performed (does not include cached requests)",
        lambda s: s.execution_count,
    ),
    (
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds (includes cached requests)",
        lambda s: s.success.ns // 1000,
    ),
    (
        "nv_inference_queue_duration_us",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
        lambda s: s.queue.ns // 1000,
    ),
    (
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
        lambda s: s.compute_input.ns // 1000,
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
        lambda s: s.compute_infer.ns // 1000,
    ),
    (
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds (does not include cached "
        "requests)",
        lambda s: s.compute_output.ns // 1000,
    ),
)

# Triton's per-model cache counters, for models with the cache enabled [V on 2.51].
_CACHE_COUNTERS: tuple[tuple[str, str, Callable[[StatsSnapshot], int]], ...] = (
    (
        "nv_cache_num_hits_per_model",
        "Number of cache hits per model",
        lambda s: s.cache_hit.count,
    ),
    (
        "nv_cache_hit_duration_per_model",
        "Total cache hit duration per model, in microseconds",
        lambda s: s.cache_hit.ns // 1000,
    ),
    (
        "nv_cache_num_misses_per_model",
        "Number of cache misses per model",
        lambda s: s.cache_miss.count,
    ),
    (
        "nv_cache_miss_duration_per_model",
        "Total cache miss (insert+lookup) duration per model, in microseconds",
        lambda s: s.cache_miss.ns // 1000,
    ),
)

# Triton's cache-wide gauges, in its order [V on 2.51].
_CACHE_GAUGES: tuple[tuple[str, str, Callable[[CacheCounters], float | int]], ...] = (
    (
        "nv_cache_util",
        "Cache utilization [0.0 - 1.0]",
        lambda c: c.used_bytes / c.capacity_bytes,
    ),
    ("nv_cache_num_entries", "Number of responses stored in response cache", lambda c: c.entries),
    ("nv_cache_num_hits", "Number of cache hits in response cache", lambda c: c.hits),
    ("nv_cache_num_misses", "Number of cache misses in response cache", lambda c: c.misses),
    ("nv_cache_num_lookups", "Number of cache lookups in response cache", lambda c: c.lookups),
    (
        "nv_cache_num_evictions",
        "Number of cache evictions in response cache",
        lambda c: c.evictions,
    ),
    (
        "nv_cache_lookup_duration",
        "Total cache lookup duration (hit and miss), in microseconds",
        lambda c: c.lookup_ns // 1000,
    ),
    (
        "nv_cache_insertion_duration",
        "Total cache insertion duration, in microseconds",
        lambda c: c.insert_ns // 1000,
    ),
)

# (family, stats kind, HELP, the Duration of the snapshot that gives _count and _sum)
_SUMMARIES: tuple[tuple[str, str, str, Callable[[StatsSnapshot], Any]], ...] = (
    (
        "nv_inference_request_summary_us",
        "request",
        "Summary of inference request duration in microseconds (includes cached requests)",
        lambda s: s.success,
    ),
    (
        "nv_inference_queue_summary_us",
        "queue",
        "Summary of inference queuing duration in microseconds (includes cached requests)",
        lambda s: s.queue,
    ),
    (
        "nv_inference_compute_input_summary_us",
        "compute_input",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
        lambda s: s.compute_input,
    ),
    (
        "nv_inference_compute_infer_summary_us",
        "compute_infer",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
        lambda s: s.compute_infer,
    ),
    (
        "nv_inference_compute_output_summary_us",
        "compute_output",
        "Cumulative inference compute output duration in microseconds (does not include cached "
        "requests)",
        lambda s: s.compute_output,
    ),
)


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """`--metrics-config` settings the bridge honours."""

    counter_latencies: bool = True
    summary_latencies: bool = False
    histogram_latencies: bool = False
    summary_quantiles: tuple[float, ...] = SUMMARY_QUANTILES


def parse_metrics_config(items: Iterable[str]) -> MetricsConfig:
    """`--metrics-config key=value` settings, as tritonserver takes them (repeatable).

    Raises ValueError with the offending setting.
    """
    known = {"counter_latencies", "summary_latencies", "histogram_latencies"}
    values: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if sep and key == "summary_quantiles":
            values[key] = _quantiles(value)
            continue
        if not sep or key not in known:
            raise ValueError(f"unsupported --metrics-config setting '{item}'")
        text = value.strip().lower()
        if text not in ("true", "false", "1", "0"):
            raise ValueError(f"--metrics-config {key} expects true or false, got '{value}'")
        values[key] = text in ("true", "1")
    return MetricsConfig(**values)


def _quantiles(text: str) -> tuple[float, ...]:
    """Triton's "<quantile>:<error>,..." (the error bound is not needed for exact quantiles)."""
    try:
        quantiles = tuple(float(part.split(":")[0]) for part in text.strip().strip('"').split(","))
    except ValueError:
        quantiles = ()
    if not quantiles or any(not 0.0 <= q <= 1.0 for q in quantiles):
        raise ValueError(f"--metrics-config summary_quantiles: cannot read '{text}'")
    return quantiles


Models = Callable[[], Mapping[str, Any]]
# model, version, its stats, a snapshot of them, decoupled, response cache enabled
Row = tuple[str, str, ModelStats, StatsSnapshot, bool, bool]


class TritonMetrics:
    """Renders the `nv_inference_*` families of the models `models()` returns at each call.

    `models` gives name -> served model (`model_repository_loader.model.Model` or anything
    with `versions: {int: obj with .stats: ModelStats}`, ensembles included, as Triton shows them);
    models without statistics are skipped.
    """

    def __init__(
        self,
        models: Models,
        config: MetricsConfig = MetricsConfig(),
        cache: ResponseCache | None = None,
    ) -> None:
        """`cache`: the worker's response cache, whose gauges are rendered too."""
        self._models = models
        self.config = config
        self._cache = cache

    def render(self) -> str:
        """Prometheus text exposition of every family (a worker can register this as is)."""
        rows = self._snapshots()
        lines: list[str] = []
        _family(
            lines,
            "nv_inference_request_success",
            "counter",
            "Number of successful inference requests, all batch sizes",
            [(_labels(m, v), s.success.count) for m, v, _, s, _, _ in rows],
        )
        _family(
            lines,
            "nv_inference_request_failure",
            "counter",
            "Number of failed inference requests, all batch sizes",
            [
                (_labels(m, v, reason=r), s.failures.get(r, 0))
                for m, v, _, s, _, _ in rows
                for r in FAILURE_REASONS
            ],
        )
        for name, help_text, value in _COUNTERS:
            if name.endswith("_us") and not self.config.counter_latencies:
                continue
            _family(
                lines,
                name,
                "counter",
                help_text,
                [(_labels(m, v), value(s)) for m, v, _, s, _, _ in rows],
            )
        cached = [row for row in rows if row[5]]
        for name, help_text, value in _CACHE_COUNTERS:
            _family(
                lines,
                name,
                "counter",
                help_text,
                [(_labels(m, v), value(s)) for m, v, _, s, _, _ in cached],
            )
        _family(
            lines,
            "nv_inference_pending_request_count",
            "gauge",
            "Instantaneous number of pending requests awaiting execution per-model.",
            [(_labels(m, v), s.queued) for m, v, _, s, _, _ in rows],
        )
        if self.config.histogram_latencies:
            _first_response_histogram(lines, [r for r in rows if r[4]])
        if self.config.summary_latencies:
            since = time.monotonic_ns() - int(SUMMARY_WINDOW_S * 1e9)
            quantiles = self.config.summary_quantiles
            for name, kind, help_text, duration in _SUMMARIES:
                _summary(lines, name, help_text, rows, kind, duration, since, quantiles)
        if self._cache is not None:
            counters = self._cache.counters()
            for name, help_text, gauge in _CACHE_GAUGES:
                lines.append(f"# HELP {name} {help_text}")
                lines.append(f"# TYPE {name} gauge")
                lines.append(f"{name} {gauge(counters)}")
        return "".join(line + "\n" for line in lines)

    def _snapshots(self) -> list[Row]:
        rows = []
        for name, model in sorted(self._models().items()):
            for version, served in sorted(getattr(model, "versions", {}).items()):
                stats = getattr(served, "stats", None)
                if isinstance(stats, ModelStats):
                    decoupled = bool(getattr(served, "decoupled", False))
                    cached = getattr(served, "cache", None) is not None
                    rows.append((name, str(version), stats, stats.snapshot(), decoupled, cached))
        return rows


def _labels(model: str, version: str, **extra: str) -> str:
    pairs = {"model": model, "version": version, **extra}
    # prometheus-cpp writes labels sorted by name; quantile comes last (see _summary).
    return ",".join(f'{k}="{_escape(pairs[k])}"' for k in sorted(pairs))


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _family(
    lines: list[str], name: str, kind: str, help_text: str, series: list[tuple[str, int]]
) -> None:
    if not series:
        return
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")
    lines.extend(f"{name}{{{labels}}} {value}" for labels, value in series)


def _summary(
    lines: list[str],
    name: str,
    help_text: str,
    rows: list[Row],
    kind: str,
    duration: Callable[[StatsSnapshot], Any],
    since_ns: int,
    quantiles: tuple[float, ...],
) -> None:
    if not rows:
        return
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} summary")
    for model, version, stats, snapshot, _, _ in rows:
        labels = _labels(model, version)
        total = duration(snapshot)
        lines.append(f"{name}_count{{{labels}}} {total.count}")
        lines.append(f"{name}_sum{{{labels}}} {total.ns // 1000}")
        window = sorted(stats.recent_values(kind, since_ns))
        for q in quantiles:
            lines.append(f'{name}{{{labels},quantile="{q:g}"}} {_quantile(window, q)}')


def _quantile(values: list[int], q: float) -> str:
    """The q-quantile of sorted ns `values`, in whole µs; Triton writes `Nan` for no data."""
    if not values:
        return "Nan"
    index = min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))
    return str(values[index] // 1000)


def _first_response_histogram(lines: list[str], rows: list[Row]) -> None:
    if not rows:
        return
    name = "nv_inference_first_response_histogram_ms"
    lines.append(f"# HELP {name} Duration from request to first response in milliseconds")
    lines.append(f"# TYPE {name} histogram")
    for model, version, _, snapshot, _, _ in rows:
        labels = _labels(model, version)
        first = snapshot.first_response
        # prometheus-cpp's order: _count, _sum, then the cumulative buckets up to +Inf.
        lines.append(f"{name}_count{{{labels}}} {first.count}")
        lines.append(f"{name}_sum{{{labels}}} {first.ns // 1_000_000}")
        cumulative = 0
        bounds = [f"{b:g}" for b in FIRST_RESPONSE_BUCKETS_MS] + ["+Inf"]
        for bound, count in zip(bounds, snapshot.first_response_buckets, strict=True):
            cumulative += count
            lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {cumulative}')
