"""Custom metrics (MetricFamily / Metric) and their Prometheus exposition.

Messages marked [V] were produced by Triton 2.51 for an instance named 'probe_0'; the
exposition lines were read from its /metrics endpoint.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from model_repository_loader.pb_utils import (
    REGISTRY,
    MetricFamily,
    TritonModelException,
    context,
    render_prometheus,
)

FAILED = "Failed to process the request for model 'probe_0', message: "


@pytest.fixture(autouse=True)
def _instance() -> Iterator[None]:
    REGISTRY.clear()
    with context.model_context(model_name="probe", instance_name="probe_0", version_dir="/m/1"):
        yield
    REGISTRY.clear()


def _error(fn: object) -> str:
    with pytest.raises(TritonModelException) as info:
        fn()  # type: ignore[operator]
    return str(info.value)


def test_kinds() -> None:
    # [V] (0, 1, 2, 'MetricKind.COUNTER', 'MetricKind')
    assert [int(k) for k in (MetricFamily.COUNTER, MetricFamily.GAUGE, MetricFamily.HISTOGRAM)] == [
        0,
        1,
        2,
    ]
    assert str(MetricFamily.COUNTER) == "MetricKind.COUNTER"
    assert type(MetricFamily.COUNTER).__name__ == "MetricKind"


def test_plain_int_kind_is_a_type_error() -> None:
    with pytest.raises(TypeError) as info:
        MetricFamily(name="x", description="d", kind=0)
    # [V]
    assert str(info.value) == (
        "__init__(): incompatible constructor arguments. The following argument types are "
        "supported:\n    1. c_python_backend_utils.MetricFamily(name: str, description: str, "
        "kind: c_python_backend_utils.MetricKind)\n\nInvoked with: kwargs: name='x', "
        "description='d', kind=0"
    )


def test_counter() -> None:
    family = MetricFamily(name="cnt", description="desc", kind=MetricFamily.COUNTER)
    metric = family.Metric(labels={"k": "v"})
    metric.increment(2)
    assert metric.value() == 2.0  # [V]
    # [V] the four texts below.
    assert _error(lambda: metric.increment(-1)) == (
        "Failed to increment metric value: "
        + FAILED
        + "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by "
        "non-negative values."
    )
    assert _error(lambda: metric.set(1)) == (
        "Failed to set metric value: " + FAILED + "TRITONSERVER_METRIC_KIND_COUNTER does not "
        "support Set"
    )
    assert _error(lambda: metric.observe(1)) == (
        "Failed to observe metric value: " + FAILED + "TRITONSERVER_METRIC_KIND_COUNTER does not "
        "support Observe"
    )
    assert _error(lambda: family.Metric(labels={"k": "v"}, buckets=[1.0])) == (
        "Failed to create metric. Unexpected buckets found."
    )


def test_same_labels_share_a_series() -> None:
    family = MetricFamily(name="cnt", description="desc", kind=MetricFamily.COUNTER)
    first = family.Metric(labels={"k": "v"})
    first.increment(2)
    second = family.Metric(labels={"k": "v"})
    second.increment(1)
    assert first.value() == 3.0  # [V] (None, 3.0)
    assert family.Metric().value() == 0.0  # [V] no labels: its own series


def test_redeclared_family() -> None:
    family = MetricFamily(name="cnt", description="desc", kind=MetricFamily.COUNTER)
    metric = family.Metric(labels={"k": "v"})
    metric.increment(3)
    # [V] same name and kind, other description: the same family (3.0); first description wins.
    again = MetricFamily(name="cnt", description="other", kind=MetricFamily.COUNTER)
    assert again.Metric(labels={"k": "v"}).value() == 3.0
    assert "# HELP cnt desc\n" in render_prometheus()
    assert _error(lambda: MetricFamily(name="cnt", description="d", kind=MetricFamily.GAUGE)) == (
        "Error when creating MetricFamily: " + FAILED + "Family name already exists with different "
        "type"
    )  # [V]


@pytest.mark.parametrize("name", ["1bad-name", ""])
def test_invalid_family_name(name: str) -> None:
    assert _error(lambda: MetricFamily(name=name, description="d", kind=MetricFamily.COUNTER)) == (
        "Error when creating MetricFamily: " + FAILED + "Invalid metric name"
    )  # [V]


def test_label_errors() -> None:
    family = MetricFamily(name="cnt", description="desc", kind=MetricFamily.COUNTER)
    # [V] for all four.
    assert _error(lambda: family.Metric(labels={"k": 1})) == (
        "Error when creating Metric: " + FAILED + "attempt to access JSON non-string as string"
    )
    assert _error(lambda: family.Metric(labels=[1])) == (
        "Failed to create metric. Labels must be a dictionary."
    )
    for labels in ({"1-k": "v"}, {"__k": "v"}):
        assert _error(lambda labels=labels: family.Metric(labels=labels)) == (
            "Error when creating Metric: " + FAILED + "Invalid label name"
        )


def test_value_argument_type() -> None:
    family = MetricFamily(name="cnt", description="d", kind=MetricFamily.COUNTER)
    metric = family.Metric()
    with pytest.raises(TypeError) as info:
        metric.increment("1")
    # [V]
    assert str(info.value).startswith(
        "increment(): incompatible function arguments. The following argument types are "
        "supported:\n    1. (self: c_python_backend_utils.Metric, arg0: float) -> None\n\n"
        "Invoked with: "
    )
    metric.increment(1)  # ints are fine [V]
    assert metric.value() == 1.0


def test_gauge() -> None:
    family = MetricFamily(name="gauge", description="desc", kind=MetricFamily.GAUGE)
    metric = family.Metric()
    metric.increment(-2)
    assert metric.value() == -2.0  # [V]
    metric.set(5)
    assert metric.value() == 5.0  # [V]
    assert _error(lambda: metric.observe(1)) == (
        "Failed to observe metric value: " + FAILED + "TRITONSERVER_METRIC_KIND_GAUGE does not "
        "support Observe"
    )  # [V]


def test_histogram() -> None:
    family = MetricFamily(name="hist", description="desc", kind=MetricFamily.HISTOGRAM)
    # [V] the three creation texts.
    assert _error(lambda: family.Metric()) == "Failed to create metric. Missing required buckets."
    assert _error(lambda: family.Metric(buckets=(1.0, 2.0))) == (
        "Failed to create metric. Buckets must be a list."
    )
    family.Metric(labels={"e": "1"}, buckets=[])  # [V] allowed
    family.Metric(labels={"e": "2"}, buckets=[1, 2])  # [V] ints allowed
    metric = family.Metric(labels={"a": "b"}, buckets=[1.0, 5.0])
    metric.observe(3)
    # [V] the three operation texts.
    assert _error(lambda: metric.value()) == (
        "Failed to get metric value: " + FAILED + "TRITONSERVER_METRIC_KIND_HISTOGRAM does not "
        "support Value"
    )
    assert _error(lambda: metric.increment(1)) == (
        "Failed to increment metric value: " + FAILED + "TRITONSERVER_METRIC_KIND_HISTOGRAM does "
        "not support Increment"
    )
    assert _error(lambda: metric.set(1)) == (
        "Failed to set metric value: " + FAILED + "TRITONSERVER_METRIC_KIND_HISTOGRAM does not "
        "support Set"
    )


@pytest.mark.parametrize("buckets", [[2.0, 1.0], [1.0, 1.0]])
def test_histogram_buckets_must_ascend(buckets: list[float]) -> None:
    # Triton 2.51's stub process dies on these; we refuse them with an error instead.
    family = MetricFamily(name="hist", description="desc", kind=MetricFamily.HISTOGRAM)
    with pytest.raises(TritonModelException, match="strictly sorted"):
        family.Metric(buckets=buckets)


def test_metric_of_a_temporary_family_is_unusable() -> None:
    # As in Triton: a Metric does not keep its MetricFamily alive, so a family that is not kept
    # in a variable is deleted at once and takes its metrics' usability with it.
    metric = MetricFamily(name="tmp", description="d", kind=MetricFamily.GAUGE).Metric()
    gc.collect()
    with pytest.raises(TritonModelException, match="has been deleted"):
        metric.set(1)


def test_family_deleted_before_its_metric() -> None:
    family = MetricFamily(name="gone", description="desc", kind=MetricFamily.COUNTER)
    metric = family.Metric()
    del family
    gc.collect()
    deleted = (
        "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
        "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects have "
        "been deleted."
    )
    # [V] the three texts.
    assert _error(lambda: metric.increment(1)) == "Failed to increment metric value: " + deleted
    assert _error(lambda: metric.value()) == "Failed to get metric value: " + deleted
    assert _error(lambda: metric.set(1)) == "Failed to set metric value: " + deleted
    # [V] the family is gone from /metrics.
    assert "gone" not in render_prometheus()


def test_exposition() -> None:
    counter = MetricFamily(name="cnt", description="desc", kind=MetricFamily.COUNTER)
    labelled = counter.Metric(labels={"k": "v"})
    labelled.increment(4)
    bare = counter.Metric()
    gauges = MetricFamily(name="gauge", description="desc", kind=MetricFamily.GAUGE)
    gauge = gauges.Metric()
    gauge.set(5)
    histogram = MetricFamily(name="hist", description="desc", kind=MetricFamily.HISTOGRAM)
    observed = histogram.Metric(labels={"a": "b"}, buckets=[1.0, 5.0])
    observed.observe(3)
    empty = histogram.Metric(labels={"e": "1"}, buckets=[])
    # [V] these lines, as Triton 2.51 printed them (series order within a family is ours).
    assert render_prometheus() == (
        "# HELP cnt desc\n"
        "# TYPE cnt counter\n"
        "cnt 0\n"
        'cnt{k="v"} 4\n'
        "# HELP gauge desc\n"
        "# TYPE gauge gauge\n"
        "gauge 5\n"
        "# HELP hist desc\n"
        "# TYPE hist histogram\n"
        'hist_count{a="b"} 1\n'
        'hist_sum{a="b"} 3\n'
        'hist_bucket{a="b",le="1"} 0\n'
        'hist_bucket{a="b",le="5"} 1\n'
        'hist_bucket{a="b",le="+Inf"} 1\n'
        'hist_count{e="1"} 0\n'
        'hist_sum{e="1"} 0\n'
        'hist_bucket{e="1",le="+Inf"} 0\n'
    )
    assert all(m is not None for m in (labelled, bare, gauge, observed, empty))  # kept alive


def test_series_disappears_with_its_last_metric() -> None:
    family = MetricFamily(name="cnt", description="desc", kind=MetricFamily.COUNTER)
    metric = family.Metric(labels={"k": "v"})
    metric.increment(1)
    assert 'cnt{k="v"} 1' in render_prometheus()
    del metric
    gc.collect()
    assert 'cnt{k="v"}' not in render_prometheus()


def test_exposition_formatting() -> None:
    family = MetricFamily(name="g", description='line\\one\ntwo "q"', kind=MetricFamily.GAUGE)
    metric = family.Metric(labels={"z": 'a"b\\c\nd', "a": "x"})
    metric.set(0.1)
    text = render_prometheus()
    assert '# HELP g line\\\\one\\ntwo "q"\n' in text
    # Labels sorted by name, values escaped; 16 significant digits like prometheus-cpp.
    assert 'g{a="x",z="a\\"b\\\\c\\nd"} 0.1\n' in text
    metric.set(float("inf"))
    assert "} +Inf\n" in render_prometheus()


def test_instance_name_comes_from_the_context() -> None:
    family = MetricFamily(name="cnt", description="desc", kind=MetricFamily.COUNTER)
    metric = family.Metric()
    with context.model_context(model_name="other", instance_name="other_3", version_dir="/o/1"):
        message = _error(lambda: metric.set(1))
    assert "for model 'other_3'" in message


def test_families_go_with_the_instance_that_made_them() -> None:
    """Under Triton a model's families end with its stub process, whatever the model holds;
    here they end when the instance's binding does (unload, reload)."""
    with context.model_context(model_name="gone", instance_name="gone_0", version_dir="/g/1"):
        kept = MetricFamily("gone_total", "made by an instance", MetricFamily.COUNTER)
        metric = kept.Metric(labels={"a": "b"})
        shared = MetricFamily("shared_total", "made by both", MetricFamily.COUNTER)
        metric.increment(1)
        assert "gone_total" in render_prometheus()
    ours = MetricFamily("shared_total", "made by both", MetricFamily.COUNTER)  # probe_0's
    text = render_prometheus()
    assert "gone_total" not in text  # `kept` is still held; the family is gone all the same
    assert "# TYPE shared_total counter" in text  # probe_0 still holds it
    with pytest.raises(TritonModelException, match="Invalid metric operation"):
        metric.increment(1)
    del kept, shared, metric, ours


@pytest.fixture
def _collect_with_the_lock_held() -> Iterator[list[object]]:
    """A collector that runs at every allocation and, whenever it finds the registry's lock held,
    drops one object of the returned list there: its finalizer runs inside the locked section,
    on the thread holding the lock, as a collection during `release_instance` does in production.
    """
    victims: list[object] = []
    dropped: list[int] = []

    def on_collect(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and victims and REGISTRY._lock.locked():
            victims.pop()  # the last reference: __del__ runs now, the lock still held
            dropped.append(1)

    threshold = gc.get_threshold()
    gc.callbacks.append(on_collect)
    gc.set_threshold(1)
    try:
        yield victims
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(on_collect)
    assert dropped, "the collector never ran inside the locked section"


def test_a_finalizer_inside_the_locked_section_does_not_deadlock(
    _collect_with_the_lock_held: list[object],
) -> None:
    """Issue 29: a Metric finalized while its registry's lock is held (here by
    `release_instance` during an instance's unbinding) used to wait for that lock on the same
    thread for ever. Many rounds in one process, each with a metric and a family dropped there."""
    victims = _collect_with_the_lock_held
    for round_ in range(200):
        with context.model_context(model_name="m", instance_name=f"m_{round_}", version_dir="/m/1"):
            family = MetricFamily("unload_total", "made by the instance", MetricFamily.COUNTER)
            metric = family.Metric(labels={"round": str(round_)})
            metric.increment(1)
            other = MetricFamily("dropped_total", "dropped under the lock", MetricFamily.GAUGE)
            victims[:] = [other, other.Metric(labels={"x": "y"}), metric]
            del family, metric, other
        # The instance is gone (its families released under the lock, the victims with them).
        assert victims == []
        text = render_prometheus()
        assert "unload_total" not in text and "dropped_total" not in text


def test_a_series_dropped_during_a_scrape_is_gone_from_the_next(
    _collect_with_the_lock_held: list[object],
) -> None:
    family = MetricFamily("scraped", "a gauge", MetricFamily.GAUGE)
    family.Metric(labels={"keep": "1"}).set(1)  # dropped at once: its series goes
    kept = family.Metric(labels={"keep": "yes"})
    kept.set(2)
    _collect_with_the_lock_held[:] = [family.Metric(labels={"keep": "no"})]
    first = render_prometheus()  # finalizes the victim while rendering
    assert 'scraped{keep="yes"} 2' in first and _collect_with_the_lock_held == []
    second = render_prometheus()
    assert 'keep="no"' not in second and 'scraped{keep="yes"} 2' in second
