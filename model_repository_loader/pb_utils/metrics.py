"""Custom metrics: `MetricFamily`, `Metric`, `MetricKind`, held in memory in a `MetricRegistry`.

Each loaded repository has its own registry (`ModelServices.metrics`, services.py), where the
families its models make live; a family made outside any repository goes to `REGISTRY`.

Semantics follow Triton (python backend + core + prometheus-cpp), texts verified on 2.51:
* families are unique by name; asking again with the same kind returns the same family (the
  first description wins), with another kind is an error;
* metrics with the same labels share one time series; a series lives while a `Metric` object
  for it exists, a family while a `MetricFamily` object for it exists;
* deleting a `MetricFamily` object before its `Metric` objects makes those metrics unusable;
* a family goes away with the model instance that made it, as the stub process ends under Triton:
  when an instance's thread ends (unload, reload), the families it acquired are released
  whether or not the model still holds the objects.

A model in an instance process (isolation/) holds stand-ins: `forward_to(link)` makes every
family and metric operation a call to the server process, where `LinkedMetrics` runs it on real
objects in the instance's registry, as Triton's stub asks its parent. So one /metrics shows them,
series with the same labels are shared with other instances, errors are that registry's texts,
and the families go when the process's instance does.

`MetricRegistry.render_prometheus()` gives the text exposition format for the bridge's /metrics
endpoint.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import itertools
import json
import math
import operator
import re
import threading
from collections.abc import Iterator
from typing import Any, Protocol

from . import context, services
from .errors import TritonModelException, bind_arguments, failed_call_text, pybind_type_error


class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    def __str__(self) -> str:  # pybind11 style: "MetricKind.COUNTER"
        return f"MetricKind.{self.name}"

    def __repr__(self) -> str:
        return f"<MetricKind.{self.name}: {self.value}>"


COUNTER = MetricKind.COUNTER
GAUGE = MetricKind.GAUGE
HISTOGRAM = MetricKind.HISTOGRAM

_KIND_NAMES = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}
_CORE_KIND = {
    COUNTER: "TRITONSERVER_METRIC_KIND_COUNTER",
    GAUGE: "TRITONSERVER_METRIC_KIND_GAUGE",
    HISTOGRAM: "TRITONSERVER_METRIC_KIND_HISTOGRAM",
}
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_FAMILY_SIGNATURE = (
    "c_python_backend_utils.MetricFamily(name: str, description: str, "
    "kind: c_python_backend_utils.MetricKind)"
)
_DELETED = (
    "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. "
    "The 'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects have "
    "been deleted."
)


def _request_failed(message: str) -> str:
    return failed_call_text(context.instance_name(), message)


class _Series:
    """One time series: a value, or a histogram's per-bucket counts, sum and count."""

    __slots__ = ("value", "bounds", "counts", "sum", "count", "references")

    def __init__(self, bounds: tuple[float, ...] | None) -> None:
        self.value = 0.0
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1) if bounds is not None else []
        self.sum = 0.0
        self.count = 0
        self.references = 0


class _Family:
    """A registered family: what the exposition shows."""

    __slots__ = ("name", "description", "kind", "series", "handles")

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        self.name = name
        self.description = description
        self.kind = kind
        self.series: dict[tuple[tuple[str, str], ...], _Series] = {}
        self.handles = 0


class _Handle:
    """Per `MetricFamily` object: its metrics stop working when the object is deleted."""

    __slots__ = ("family", "deleted", "released", "owner", "registry")

    def __init__(self, family: _Family, owner: int | None, registry: MetricRegistry) -> None:
        self.family = family
        self.deleted = False  # the model deleted its MetricFamily (or its instance went)
        self.released = False  # the registry has dropped the handle's reference to the family
        self.owner = owner  # id() of the ModelContext of the instance that made it
        self.registry = registry  # where the family lives


class MetricRegistry:
    """Every live custom metric family of one repository's models (or of the process's models
    outside any repository: `REGISTRY`).

    Finalizers never wait for the lock. `MetricFamily.__del__` and `Metric.__del__` run whenever
    the collector does, which may be on a thread that holds `_lock` already (in the middle of
    `release_instance`, say): there a blocking acquire would wait for ever. So a finalizer queues
    its release (`deque.append` is atomic) and applies the queue only if it gets the lock
    without waiting; whoever takes the lock next applies the rest first (`_locked`), so
    releases keep their order against later acquisitions.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}
        # id(ModelContext) -> the live handles acquired by that instance.
        self._owned: dict[int, dict[int, _Handle]] = {}
        # Releases from finalizers not yet applied: a _Handle, or (family, labels) of a series.
        self._deferred: collections.deque[_Handle | tuple[_Family, tuple[tuple[str, str], ...]]]
        self._deferred = collections.deque()

    def render_prometheus(self) -> str:
        """The Prometheus text exposition of all families (empty string when there are none)."""
        lines: list[str] = []
        with self._locked():
            for family in self._families.values():
                lines.append(f"# HELP {family.name} {_escape_help(family.description)}")
                lines.append(f"# TYPE {family.name} {_KIND_NAMES[family.kind]}")
                for labels in sorted(family.series):
                    _render_series(lines, family, labels, family.series[labels])
        return "".join(line + "\n" for line in lines)

    def clear(self) -> None:
        """Forget every family (tests; a fresh process has none)."""
        with self._locked():
            self._families.clear()
            self._owned.clear()
            self._deferred.clear()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the lock, with every release queued by a finalizer applied first."""
        with self._lock:
            self._apply_deferred()
            yield

    def _apply_deferred(self) -> None:
        # Called with the lock held. popleft is atomic, so a finalizer that runs meanwhile (and
        # fails to take the lock) only appends to what this loop will still see.
        while True:
            try:
                item = self._deferred.popleft()
            except IndexError:
                return
            if isinstance(item, _Handle):
                self._release_locked(item)
            else:
                self._release_series_locked(*item)

    def _release_later(self, item: _Handle | tuple[_Family, tuple[tuple[str, str], ...]]) -> None:
        """From a finalizer: queue the release, and apply the queue if the lock is free now."""
        self._deferred.append(item)
        if self._lock.acquire(blocking=False):
            try:
                self._apply_deferred()
            finally:
                self._lock.release()

    # -- used by MetricFamily / Metric ------------------------------------------------------

    def _acquire_family(self, name: str, description: str, kind: MetricKind) -> _Handle:
        with self._locked():
            family = self._families.get(name)
            if family is None:
                family = self._families[name] = _Family(name, description, kind)
            elif family.kind != kind:
                raise TritonModelException(
                    "Error when creating MetricFamily: "
                    + _request_failed("Family name already exists with different type")
                )
            family.handles += 1
            owner = context.current_model()
            handle = _Handle(family, id(owner) if owner is not None else None, self)
            if handle.owner is not None:
                self._owned.setdefault(handle.owner, {})[id(handle)] = handle
            return handle

    def _release_locked(self, handle: _Handle) -> None:
        handle.deleted = True
        if handle.released:
            return
        handle.released = True
        if handle.owner is not None:
            owned = self._owned.get(handle.owner)
            if owned is not None:
                owned.pop(id(handle), None)
        family = handle.family
        family.handles -= 1
        if family.handles <= 0 and self._families.get(family.name) is family:
            del self._families[family.name]

    def release_instance(self, instance: context.ModelContext) -> None:
        """Release every family `instance` acquired and still holds (the instance is gone)."""
        with self._locked():
            for handle in list(self._owned.pop(id(instance), {}).values()):
                self._release_locked(handle)

    def _acquire_series(
        self, family: _Family, labels: tuple[tuple[str, str], ...], bounds: tuple[float, ...] | None
    ) -> _Series:
        with self._locked():
            series = family.series.get(labels)
            if series is None:
                series = family.series[labels] = _Series(bounds)
            series.references += 1
            return series

    def _release_series_locked(self, family: _Family, labels: tuple[tuple[str, str], ...]) -> None:
        series = family.series.get(labels)
        if series is not None:
            series.references -= 1
            if series.references <= 0:
                del family.series[labels]


# The families made outside any loaded repository (a model object used on its own, tests).
REGISTRY = MetricRegistry()


def registry_of(instance: context.ModelContext | None) -> MetricRegistry:
    """The registry of `instance`'s repository (REGISTRY when it has none)."""
    owner = instance.services if instance is not None else None
    return owner.metrics if owner is not None and owner.metrics is not None else REGISTRY


def _current_registry() -> MetricRegistry:
    owner = services.current()
    return owner.metrics if owner is not None and owner.metrics is not None else REGISTRY


# When an instance goes, so do the families it made, in its repository's registry.
context.on_unbound(lambda instance: registry_of(instance).release_instance(instance))


def render_prometheus() -> str:
    """The families made outside any repository (`REGISTRY`), in the text exposition format."""
    return REGISTRY.render_prometheus()


class MetricFamily:
    """`MetricFamily(name, description, kind)` with kind `MetricFamily.COUNTER|GAUGE|HISTOGRAM`."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    __slots__ = ("_handle", "__weakref__")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._handle: _Handle | _Remote | None = None
        params = bind_arguments(("name", "description", "kind"), args, kwargs)
        if (
            params is None
            or not isinstance(params.get("name"), str)
            or not isinstance(params.get("description"), str)
            or not isinstance(params.get("kind"), MetricKind)
        ):
            raise pybind_type_error("__init__", _FAMILY_SIGNATURE, args, kwargs)
        name = params["name"]
        if _link is not None:
            kind = params["kind"]
            self._handle = _Remote(
                _link.call("family", name, params["description"], int(kind)), kind
            )
            return
        if not _METRIC_NAME.match(name):
            raise TritonModelException(
                "Error when creating MetricFamily: " + _request_failed("Invalid metric name")
            )
        self._handle = _current_registry()._acquire_family(
            name, params["description"], params["kind"]
        )

    def Metric(self, labels: Any = None, buckets: Any = None) -> Metric:  # noqa: N802 - Triton's name
        """A metric of this family with the given labels (and buckets, for histograms)."""
        handle = self._handle
        assert handle is not None  # set by __init__
        kind = handle.kind if isinstance(handle, _Remote) else handle.family.kind
        if labels is None:
            labels = {}
        elif not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        if kind == HISTOGRAM:
            if buckets is None:
                raise TritonModelException("Failed to create metric. Missing required buckets.")
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            bounds = tuple(_as_float(b, "Metric", (self, labels, buckets)) for b in buckets)
        elif buckets is not None:
            raise TritonModelException("Failed to create metric. Unexpected buckets found.")
        else:
            bounds = None
        key = _label_key(labels)
        if bounds is not None and any(a >= b for a, b in zip(bounds, bounds[1:], strict=False)):
            # Triton 2.51's stub dies here (prometheus-cpp throws); we report it instead.
            raise TritonModelException(
                "Error when creating Metric: "
                + _request_failed("Bucket Boundaries must be strictly sorted")
            )
        if isinstance(handle, _Remote):
            assert _link is not None
            return Metric._create(
                _Remote(_link.call("metric", handle.number, key, bounds), kind), key
            )
        series = handle.registry._acquire_series(handle.family, key, bounds)
        return Metric._create(handle, key, series)

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if isinstance(handle, _Remote):
            _release_remote(handle)
        elif handle is not None and not handle.deleted:
            handle.deleted = True  # its metrics stop working now, whatever the lock
            try:
                handle.registry._release_later(handle)
            except Exception:  # interpreter shutdown
                pass


class Metric:
    """One time series of a family: `increment`, `set`, `observe`, `value`."""

    __slots__ = ("_handle", "_labels", "_series", "__weakref__")
    _handle: _Handle | _Remote
    _labels: tuple[tuple[str, str], ...]
    _series: _Series | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("c_python_backend_utils.Metric: No constructor defined!")

    @classmethod
    def _create(
        cls,
        handle: _Handle | _Remote,
        labels: tuple[tuple[str, str], ...],
        series: _Series | None = None,
    ) -> Metric:
        metric = cls.__new__(cls)
        metric._handle = handle
        metric._labels = labels
        metric._series = series
        return metric

    def increment(self, *args: Any, **kwargs: Any) -> None:
        value = self._argument("increment", args, kwargs)
        if isinstance(self._handle, _Remote):
            return _call_remote("increment", self._handle, value)
        kind, series, lock = self._usable("increment")
        if kind == HISTOGRAM:
            raise self._unsupported("increment", kind, "Increment")
        if kind == COUNTER and value < 0.0:
            raise TritonModelException(
                "Failed to increment metric value: "
                + _request_failed(
                    "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by "
                    "non-negative values."
                )
            )
        with lock:
            series.value += value

    def set(self, *args: Any, **kwargs: Any) -> None:
        value = self._argument("set", args, kwargs)
        if isinstance(self._handle, _Remote):
            return _call_remote("set", self._handle, value)
        kind, series, lock = self._usable("set")
        if kind != GAUGE:
            raise self._unsupported("set", kind, "Set")
        with lock:
            series.value = value

    def observe(self, *args: Any, **kwargs: Any) -> None:
        value = self._argument("observe", args, kwargs)
        if isinstance(self._handle, _Remote):
            return _call_remote("observe", self._handle, value)
        kind, series, lock = self._usable("observe")
        if kind != HISTOGRAM:
            raise self._unsupported("observe", kind, "Observe")
        bounds = series.bounds or ()
        index = len(bounds)
        for i, bound in enumerate(bounds):
            if value <= bound:
                index = i
                break
        with lock:
            series.counts[index] += 1
            series.sum += value
            series.count += 1

    def value(self, *args: Any, **kwargs: Any) -> float:
        if args or kwargs:
            raise pybind_type_error(
                "value", "(self: c_python_backend_utils.Metric) -> float", (self, *args), kwargs
            )
        if isinstance(self._handle, _Remote):
            return _call_remote("value", self._handle)
        kind, series, lock = self._usable("get")
        if kind == HISTOGRAM:
            raise self._unsupported("get", kind, "Value")
        return series.value

    def _argument(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> float:
        if len(args) != 1 or kwargs:
            raise pybind_type_error(
                method,
                "(self: c_python_backend_utils.Metric, arg0: float) -> None",
                (self, *args),
                kwargs,
            )
        return _as_float(args[0], method, (self, *args))

    def _usable(self, verb: str) -> tuple[MetricKind, _Series, threading.Lock]:
        """The family's kind, this metric's series and the lock guarding it: a local metric's,
        of a live family."""
        handle = self._handle
        assert isinstance(handle, _Handle) and self._series is not None
        if handle.deleted:
            raise TritonModelException(f"Failed to {verb} metric value: {_DELETED}")
        return handle.family.kind, self._series, handle.registry._lock

    @staticmethod
    def _unsupported(verb: str, kind: MetricKind, operation: str) -> TritonModelException:
        return TritonModelException(
            f"Failed to {verb} metric value: "
            + _request_failed(f"{_CORE_KIND[kind]} does not support {operation}")
        )

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if isinstance(handle, _Remote):
            _release_remote(handle)
        elif handle is not None:
            try:
                handle.registry._release_later((handle.family, self._labels))
            except Exception:  # interpreter shutdown
                pass


# -- families held by another process -------------------------------------------------------------


class MetricsLink(Protocol):
    """How a model process reaches the server process's registry (isolation/child.py)."""

    def call(self, op: str, *args: Any) -> Any:
        """Run `op` (see LinkedMetrics.run) there and return its result.

        Raises TritonModelException with the text that side raised.
        """

    def release(self, op: str, *args: Any) -> None:
        """Run `op` there without waiting for it; callable from `__del__` (takes no lock)."""


class _Remote:
    """A family or metric the server process holds for this one, by its number there."""

    __slots__ = ("number", "kind")

    def __init__(self, number: int, kind: MetricKind) -> None:
        self.number = number
        self.kind = kind


_link: MetricsLink | None = None


def forward_to(link: MetricsLink | None) -> None:
    """From now on, families and metrics made in this process live where `link` leads."""
    global _link
    _link = link


def _call_remote(op: str, handle: _Remote, *args: Any) -> Any:
    assert _link is not None
    return _link.call(op, handle.number, *args)


def _release_remote(handle: _Remote) -> None:
    link = _link
    if link is not None:
        try:
            link.release("delete", handle.number)
        except Exception:  # interpreter shutdown
            pass


class LinkedMetrics:
    """The families and metrics one model process holds, as real objects in this process.

    `run` is one operation of that process's MetricsLink. It runs with the process's instance
    bound (`model_context`), so errors name the instance and the families are that instance's:
    its registry's `release_instance` drops them when the process goes. One thread calls `run`.
    """

    _OPERATIONS = frozenset({"increment", "set", "observe", "value"})

    def __init__(self) -> None:
        self._objects: dict[int, MetricFamily | Metric] = {}
        self._ids = itertools.count(1)

    def run(self, op: str, args: tuple[Any, ...]) -> Any:
        if op == "family":
            name, description, kind = args
            return self._add(MetricFamily(name, description, MetricKind(kind)))
        if op == "metric":
            family, labels, bounds = args
            buckets = None if bounds is None else list(bounds)
            return self._add(self._family(family).Metric(labels=dict(labels), buckets=buckets))
        if op == "delete":
            self._objects.pop(args[0], None)  # the object's __del__ releases it
            return None
        if op not in self._OPERATIONS:
            raise ValueError(f"unknown metric operation {op!r}")
        metric = self._objects[args[0]]
        assert isinstance(metric, Metric)
        return getattr(metric, op)(*args[1:])

    def clear(self) -> None:
        """Drop every object (the process is gone)."""
        self._objects.clear()

    def _family(self, number: int) -> MetricFamily:
        family = self._objects[number]
        assert isinstance(family, MetricFamily)
        return family

    def _add(self, obj: MetricFamily | Metric) -> int:
        number = next(self._ids)
        self._objects[number] = obj
        return number


def _label_key(labels: dict[Any, Any]) -> tuple[tuple[str, str], ...]:
    # Triton sends labels as JSON: non-str keys become strings, non-str values are refused.
    pairs = []
    for name, value in labels.items():
        if not isinstance(value, str):
            raise TritonModelException(
                "Error when creating Metric: "
                + _request_failed("attempt to access JSON non-string as string")
            )
        if not isinstance(name, str):
            name = _json_key(name)
        if not _LABEL_NAME.match(name) or name.startswith("__"):
            raise TritonModelException(
                "Error when creating Metric: " + _request_failed("Invalid label name")
            )
        pairs.append((name, value))
    return tuple(sorted(pairs))


def _json_key(key: Any) -> str:
    """The text a non-str dict key becomes in JSON (1 -> "1", True -> "true")."""
    try:
        return next(iter(json.loads(json.dumps({key: None}))))
    except TypeError:
        raise TritonModelException(
            "Failed to create metric. Labels must be a dictionary."
        ) from None


def _as_float(value: Any, method: str, invoked: tuple[Any, ...]) -> float:
    # pybind's float caster: numbers and objects with __float__ / __index__, never str.
    if isinstance(value, (str, bytes)):
        value = None
    try:
        return float(value)
    except (TypeError, ValueError):
        pass
    try:
        return float(operator.index(value))
    except TypeError:
        raise pybind_type_error(
            method, "(self: c_python_backend_utils.Metric, arg0: float) -> None", invoked, {}
        ) from None


def _format_value(value: float) -> str:
    # prometheus-cpp prints doubles with 16 significant digits; Inf/NaN have fixed spellings.
    if math.isnan(value):
        return "Nan"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:.16g}"


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels_text(labels: tuple[tuple[str, str], ...], extra: tuple[str, str] | None = None) -> str:
    pairs = list(labels)
    if extra is not None:
        pairs.append(extra)
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape_label(v)}"' for k, v in pairs) + "}"


def _render_series(
    lines: list[str], family: _Family, labels: tuple[tuple[str, str], ...], series: _Series
) -> None:
    name = family.name
    if family.kind != HISTOGRAM:
        lines.append(f"{name}{_labels_text(labels)} {_format_value(series.value)}")
        return
    # prometheus-cpp's order: _count, _sum, then cumulative _bucket lines ending at +Inf [V].
    lines.append(f"{name}_count{_labels_text(labels)} {series.count}")
    lines.append(f"{name}_sum{_labels_text(labels)} {_format_value(series.sum)}")
    cumulative = 0
    for bound, count in zip(series.bounds or (), series.counts, strict=False):
        cumulative += count
        le = ("le", _format_value(bound))
        lines.append(f"{name}_bucket{_labels_text(labels, le)} {cumulative}")
    lines.append(f"{name}_bucket{_labels_text(labels, ('le', '+Inf'))} {series.count}")
