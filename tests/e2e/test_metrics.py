"""The metrics port: Triton's `nv_inference_*` metrics after known traffic, custom
`pb_utils.MetricFamily` metrics and /health on the same port (with `--frontend dynamo`, Dynamo's
frontend metrics too: tests/e2e/test_roles.py),
`--allow-metrics=false`.

The port is scraped with a real HTTP client and parsed with prometheus_client's text parser.
Expected values are Triton 2.51's for the same traffic (tests/repositories/metrics/README.md;
tests/differential/test_diff_metrics.py compares with the real Triton).
"""

from __future__ import annotations

import queue
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.metrics_support import METRICS, rows_input, scrape, send_known_traffic, value
from tests.e2e.reload_support import control
from tests.e2e.support import REPOSITORIES, WAIT_S, BackgroundInfer, Gate, wait_until
from tests.harness.ports import free_port

M = {"model": "counted", "version": "1"}


def get(port: int, path: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
        return response.status, response.read()


def test_metrics_after_known_traffic(bridge_server, repository, tmp_path) -> None:
    control_port = free_port()
    server = bridge_server(
        repository(METRICS),
        "--model-control-mode=explicit",
        "--load-model=counted",
        f"--control-port={control_port}",
        "--metrics-config",
        "summary_latencies=true",
    )
    port = server.metrics_port

    at_rest = scrape(port)
    assert value(at_rest, "nv_inference_request_success", **M) == 0
    # A host without GPUs has no GPU families (tests/gpu checks them where there are GPUs).
    assert not [name for name in at_rest if name.startswith("nv_gpu_")]
    assert value(at_rest, "nv_inference_pending_request_count", **M) == 0
    assert value(at_rest, "counted_requests", kind="ok") == 0

    outcomes = send_known_traffic(server.grpc_url)
    assert outcomes[0] == outcomes[1] == outcomes[3] == "ok"
    assert "negative input" in outcomes[2]
    assert "asked to raise" in outcomes[4]

    after = scrape(port)
    # A model's error response is a success for Triton; an exception in execute a BACKEND failure.
    assert value(after, "nv_inference_request_success", **M) == 4
    failures = {r: value(after, "nv_inference_request_failure", reason=r, **M) for r in
                ("REJECTED", "CANCELED", "BACKEND", "OTHER")}  # fmt: skip
    assert failures == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 1, "OTHER": 0}
    assert value(after, "nv_inference_count", **M) == 8  # rows of the successful requests
    assert value(after, "nv_inference_exec_count", **M) == 2  # one batch of four, one of one
    assert value(after, "nv_inference_pending_request_count", **M) == 0
    for name in ("nv_inference_request_duration_us", "nv_inference_compute_infer_duration_us"):
        assert value(after, name, **M) > 0, name
    assert value(after, "nv_inference_queue_duration_us", **M) >= 0
    # summary_latencies=true: _count/_sum match the counters, quantiles over recent requests.
    assert value(after, "nv_inference_request_summary_us_count", **M) == 4
    assert value(after, "nv_inference_request_summary_us_sum", **M) == value(
        after, "nv_inference_request_duration_us", **M
    )
    assert value(after, "nv_inference_request_summary_us", quantile="0.5", **M) > 0
    # The model's own metrics, as it changed them.
    assert value(after, "counted_requests", kind="ok") == 3
    assert value(after, "counted_requests", kind="failed") == 1
    assert value(after, "counted_last_batch") == 8
    assert value(after, "counted_rows_count") == 4
    assert value(after, "counted_rows_bucket", le="2") == 3

    # Pending = queued, not executing: hold the only instance, queue one more request.
    client = server.client()
    gate = Gate(tmp_path)
    held = BackgroundInfer(client, "counted", [rows_input(5, 8)], parameters=gate.params("a"))
    wait_until(lambda: gate.started("a"), "the held request to start")
    queued = BackgroundInfer(client, "counted", [rows_input(6, 8)])
    wait_until(
        lambda: value(scrape(port), "nv_inference_pending_request_count", **M) == 1,
        "one pending request",
    )
    gate.open()
    held.result()
    queued.result()
    assert value(scrape(port), "nv_inference_pending_request_count", **M) == 0

    # Triton's health routes answer on the metrics port too (Dynamo's /health and /live, with
    # --frontend dynamo: tests/e2e/test_roles.py).
    assert get(port, "/v2/health/live")[0] == 200
    assert get(port, "/v2/health/ready")[0] == 200

    # Unloaded: the model's rows and its custom families are gone.
    assert control(control_port, "/v2/repository/models/counted/unload") == (200, None)

    def gone() -> bool:
        samples = scrape(port)
        return value(samples, "nv_inference_request_success", **M) is None and not any(
            name.startswith("counted_") for name in samples
        )

    wait_until(gone, "the unloaded model's metrics to disappear")


def test_metrics_of_process_instances(bridge_server, repository) -> None:
    """A model whose instance runs in a child process: same counts, and its custom metrics."""
    server = bridge_server(
        repository(METRICS), "--model-control-mode=explicit", "--load-model=counted_process"
    )
    outcomes = send_known_traffic(server.grpc_url, "counted_process")
    assert outcomes[0] == "ok"
    labels = {"model": "counted_process", "version": "1"}
    # The failed request counts when the instance process reports its batch done, which may
    # come after its client has the error (seen once under a loaded CI run).
    def counted() -> dict | None:
        samples = scrape(server.metrics_port)
        failed = value(samples, "nv_inference_request_failure", reason="BACKEND", **labels)
        return samples if failed == 1 else None

    samples = wait_until(counted, "the failed request to be counted")
    assert value(samples, "nv_inference_request_success", **labels) == 4
    assert value(samples, "nv_inference_count", **labels) == 8
    assert value(samples, "counted_process_requests", kind="ok") == 3


def test_allow_metrics_false_serves_nothing(bridge_server, repository) -> None:
    server = bridge_server(
        repository(METRICS),
        "--model-control-mode=explicit",
        "--load-model=counted",
        "--allow-metrics=false",
    )
    assert server.client().is_model_ready("counted")
    with pytest.raises(urllib.error.URLError):
        get(server.metrics_port, "/metrics")


def test_first_response_histogram_of_a_decoupled_model(bridge_server) -> None:
    server = bridge_server(
        REPOSITORIES / "streaming",
        "--model-control-mode=explicit",
        "--load-model=repeat",
        "--metrics-config=histogram_latencies=true",
    )
    client = server.client()
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error))
    tensor = grpcclient.InferInput("IN", [3], "INT32")
    tensor.set_data_from_numpy(np.array([1, 2, 3], np.int32))
    client.async_stream_infer("repeat", [tensor])
    assert [answers.get(timeout=WAIT_S) for _ in range(3)] == [None, None, None]
    client.stop_stream()
    labels = {"model": "repeat", "version": "1"}
    name = "nv_inference_first_response_histogram_ms"

    def counted() -> dict | None:
        samples = scrape(server.metrics_port)
        return samples if value(samples, f"{name}_count", **labels) == 1 else None

    samples = wait_until(counted, "the first response to be counted")
    assert value(samples, f"{name}_bucket", le="+Inf", **labels) == 1
    assert value(samples, "nv_inference_request_success", **labels) == 1
