"""bridge/metrics/triton.py: Triton's nv_inference_* exposition from ModelStats, and
--metrics-config. Texts, label order and formats were read from Triton 2.51's metrics port."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bridge.metrics.triton import MetricsConfig, TritonMetrics, parse_metrics_config
from model_repository_loader.scheduling.stats import ModelStats


def _models() -> tuple[dict, ModelStats]:
    stats = ModelStats()
    stats.record_execution(8, 4, queue_ns=4_000, input_ns=0, infer_ns=2_000_000, output_ns=0)
    for _ in range(4):
        stats.record_request(True, 2, 3_000_000)
    stats.record_request(False, 1, 1_000, "REJECTED")
    stats.queue_changed(1)
    version = SimpleNamespace(stats=stats)
    ensemble = SimpleNamespace(versions={1: SimpleNamespace()})  # no statistics: not shown
    return {"m": SimpleNamespace(versions={3: version}), "ens": ensemble}, stats


def test_counters_in_tritons_shape() -> None:
    models, _ = _models()
    text = TritonMetrics(lambda: models).render()
    lines = text.splitlines()
    assert lines[:3] == [
        "# HELP nv_inference_request_success Number of successful inference requests, "
        "all batch sizes",
        "# TYPE nv_inference_request_success counter",
        'nv_inference_request_success{model="m",version="3"} 4',
    ]
    assert 'nv_inference_request_failure{model="m",reason="REJECTED",version="3"} 1' in lines
    assert 'nv_inference_request_failure{model="m",reason="BACKEND",version="3"} 0' in lines
    assert 'nv_inference_count{model="m",version="3"} 8' in lines
    assert 'nv_inference_exec_count{model="m",version="3"} 1' in lines
    assert 'nv_inference_request_duration_us{model="m",version="3"} 12000' in lines
    assert 'nv_inference_compute_infer_duration_us{model="m",version="3"} 8000' in lines
    assert 'nv_inference_pending_request_count{model="m",version="3"} 1' in lines
    assert "# TYPE nv_inference_pending_request_count gauge" in lines
    assert "ens" not in text and "summary" not in text
    assert len(list(text_string_to_metric_families(text))) == 10  # a parser reads it whole


def test_summaries() -> None:
    models, stats = _models()
    text = TritonMetrics(lambda: models, MetricsConfig(summary_latencies=True)).render()
    lines = text.splitlines()
    assert "# TYPE nv_inference_request_summary_us summary" in lines
    assert 'nv_inference_request_summary_us_count{model="m",version="3"} 4' in lines
    assert 'nv_inference_request_summary_us_sum{model="m",version="3"} 12000' in lines
    assert 'nv_inference_request_summary_us{model="m",version="3",quantile="0.5"} 3000' in lines
    assert 'nv_inference_queue_summary_us{model="m",version="3",quantile="0.999"} 1' in lines
    # A window with nothing in it: Triton writes Nan.
    assert stats.recent_values("request", time.monotonic_ns() + 1) == []
    empty = TritonMetrics(lambda: {"e": SimpleNamespace(versions={1: SimpleNamespace(
        stats=ModelStats())})}, MetricsConfig(summary_latencies=True)).render()  # fmt: skip
    assert 'nv_inference_request_summary_us{model="e",version="1",quantile="0.5"} Nan' in empty


def test_counter_latencies_false_drops_the_duration_counters() -> None:
    models, _ = _models()
    text = TritonMetrics(lambda: models, MetricsConfig(counter_latencies=False)).render()
    assert "nv_inference_count" in text and "_duration_us" not in text


def test_metrics_config() -> None:
    assert parse_metrics_config([]) == MetricsConfig()
    assert parse_metrics_config(["summary_latencies=true", "counter_latencies=false"]) == (
        MetricsConfig(counter_latencies=False, summary_latencies=True)
    )
    assert parse_metrics_config(['summary_quantiles="0.5:0.05,0.9:0.01"']).summary_quantiles == (
        0.5,
        0.9,
    )
    for bad in (
        "summary_latencies",
        "summary_latencies=maybe",
        "nope=true",
        "summary_quantiles=x",
        "summary_quantiles=2:0.1",
    ):
        with pytest.raises(ValueError):
            parse_metrics_config([bad])


def test_first_response_histogram_of_decoupled_models() -> None:
    models, stats = _models()
    stats.record_first_response(50_000_000)  # 50 ms
    stats.record_first_response(3_000_000_000)  # 3 s
    decoupled = ModelStats()
    decoupled.record_first_response(700_000_000)
    models["d"] = SimpleNamespace(versions={1: SimpleNamespace(stats=decoupled, decoupled=True)})
    text = TritonMetrics(lambda: models, MetricsConfig(histogram_latencies=True)).render()
    name = "nv_inference_first_response_histogram_ms"
    lines = [line for line in text.splitlines() if line.startswith(name)]
    assert lines == [  # only the decoupled model has one
        f'{name}_count{{model="d",version="1"}} 1',
        f'{name}_sum{{model="d",version="1"}} 700',
        f'{name}_bucket{{model="d",version="1",le="100"}} 0',
        f'{name}_bucket{{model="d",version="1",le="500"}} 0',
        f'{name}_bucket{{model="d",version="1",le="2000"}} 1',
        f'{name}_bucket{{model="d",version="1",le="5000"}} 1',
        f'{name}_bucket{{model="d",version="1",le="+Inf"}} 1',
    ]
    assert f"# TYPE {name} histogram" in text
    assert name not in TritonMetrics(lambda: models).render()  # off by default
    assert stats.snapshot().first_response_buckets == [1, 0, 0, 1, 0]
