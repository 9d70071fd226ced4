"""OpenTelemetry mode end to end: spans exported over OTLP/HTTP to a real receiver
(tests/harness/otlp_receiver.py), parented across a BLS call and an ensemble step served by
another bridge process, under the client's `traceparent`.

Two bridges share one file-discovery folder: B serves tests/repositories/cluster_b (`add_sub`),
A serves tests/repositories/tracing (`bls_traced` calls `add_sub` with `trace=request.trace()`,
`remote_pipeline` runs `scale` here and `add_sub` in B) with `--frontend triton` and
`--trace-config mode=opentelemetry`.
"""

from __future__ import annotations

import secrets

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.cluster_support import file_discovery_env, start_bridge
from tests.harness.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.harness.repositories import materialize

X = np.array([1, 2, 3, 4], np.float32)


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    folder = tmp_path_factory.mktemp("otel")
    env = file_discovery_env(folder / "kv")
    with OtlpReceiver() as receiver:
        b = start_bridge(materialize("cluster_b", folder), env, folder / "b.log")
        try:
            a = start_bridge(
                materialize("tracing", folder),
                env,
                folder / "a.log",
                "--frontend=triton",
                "--trace-config=mode=opentelemetry",
                "--trace-config=level=TIMESTAMPS",  # rate 1000: only requests with context
                f"--trace-config=opentelemetry,url={receiver.endpoint}",
                "--trace-config=opentelemetry,resource=service.name=bridge-under-test",
                "--trace-config=opentelemetry,bsp_schedule_delay=50",
            )
        except BaseException:
            b.stop()
            raise
        try:
            yield a, receiver
        finally:
            a.stop()
            b.stop()


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def _of_trace(trace_id: str, count: int):
    return lambda spans: len([s for s in spans if s.trace_id == trace_id]) >= count


def _children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> dict[str, ReceivedSpan]:
    return {s.name: s for s in spans if s.parent_span_id == parent.span_id}


def test_bls_call_to_another_process_is_a_child_span(traced) -> None:
    a, receiver = traced
    header, trace_id, client_span = _traceparent()
    client = grpcclient.InferenceServerClient(a.grpc_url)
    x = grpcclient.InferInput("X", [4], "FP32")
    x.set_data_from_numpy(X)
    result = client.infer("bls_traced", [x], headers={"traceparent": header})
    np.testing.assert_array_equal(result.as_numpy("Y"), 2 * X)
    # InferRequest, bls_traced, its queue and compute, add_sub, its queue and compute
    spans = [s for s in receiver.wait_for(_of_trace(trace_id, 7)) if s.trace_id == trace_id]
    (root,) = [s for s in spans if s.name == "InferRequest"]
    assert root.parent_span_id == client_span  # the client's traceparent honoured
    assert root.attributes["triton.protocol"] == "GRPC"
    assert root.resource["service.name"] == "bridge-under-test"
    model = _children(spans, root)["bls_traced"]
    assert model.attributes["triton.model_name"] == "bls_traced"
    steps = _children(spans, model)
    assert set(steps) == {"queue", "compute"}
    callee = _children(spans, steps["compute"])["add_sub"]  # measured in process B
    assert callee.attributes["triton.trace_kind"] == "BLS"
    assert set(_children(spans, callee)) == {"queue", "compute"}
    assert steps["compute"].start_ns <= callee.start_ns <= callee.end_ns <= steps["compute"].end_ns


def test_ensemble_steps_across_processes_are_child_spans(traced) -> None:
    a, receiver = traced
    header, trace_id, client_span = _traceparent()
    body = {"inputs": [{"name": "RAW", "datatype": "FP32", "shape": [4], "data": X.tolist()}]}
    answer = httpx.post(
        f"http://{a.http_url}/v2/models/remote_pipeline/infer",
        json=body,
        headers={"traceparent": header},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    # InferRequest, remote_pipeline, scale (+ queue, compute), add_sub (+ queue, compute)
    spans = [s for s in receiver.wait_for(_of_trace(trace_id, 8)) if s.trace_id == trace_id]
    (root,) = [s for s in spans if s.name == "InferRequest"]
    assert root.parent_span_id == client_span
    assert "HTTP_RECV_START" in root.events and "HTTP_SEND_END" in root.events
    ensemble = _children(spans, root)["remote_pipeline"]
    steps = _children(spans, ensemble)
    assert set(steps) == {"scale", "add_sub"}
    for step in steps.values():
        assert step.attributes["triton.trace_kind"] == "ENSEMBLE_STEP"
        assert set(_children(spans, step)) == {"queue", "compute"}


def test_trace_settings_say_opentelemetry(traced) -> None:
    a, _ = traced
    settings = httpx.get(f"http://{a.http_url}/v2/trace/setting", timeout=30).json()
    assert settings["trace_mode"] == "opentelemetry"
    assert settings["trace_level"] == ["TIMESTAMPS"] and settings["trace_rate"] == "1000"


def test_only_requests_with_a_trace_context_are_traced_below_the_rate(traced) -> None:
    """Rate 1000: a request without `traceparent` is not traced; one with it always is (as
    Triton forces the sample of a propagated context)."""
    a, receiver = traced
    client = grpcclient.InferenceServerClient(a.grpc_url)
    x = grpcclient.InferInput("X", [4], "FP32")
    x.set_data_from_numpy(X)
    roots_before = {s.trace_id for s in receiver.spans if s.name == "InferRequest"}
    client.infer("bls_traced", [x])  # untraced
    header, trace_id, _ = _traceparent()
    client.infer("bls_traced", [x], headers={"traceparent": header})
    receiver.wait_for(_of_trace(trace_id, 7))
    roots = {s.trace_id for s in receiver.spans if s.name == "InferRequest"} - roots_before
    assert roots == {trace_id}
