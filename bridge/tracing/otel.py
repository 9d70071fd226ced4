"""OpenTelemetry mode (`--trace-config mode=opentelemetry`): each traced request's spans,
exported over OTLP/HTTP with the OpenTelemetry SDK.

The spans are made at the door once the request is answered, from what the wire, the worker
and every process its BLS calls and ensemble steps went through measured (one clock per host,
CLOCK_MONOTONIC, turned into wall time here):

- `InferRequest` (the wire's span: receive to send), a child of the client's `traceparent`
  (W3C Trace Context, an HTTP header or gRPC metadata) when it sent one;
- under it one span named after the model (REQUEST_START to REQUEST_END), with `queue`
  (QUEUE_START to COMPUTE_START) and `compute` (COMPUTE_START to COMPUTE_END) under that;
- each ensemble step and each BLS call (the caller passed `trace=request.trace()`) a model span
  of its own under its caller's, with `triton.trace_kind` saying which, however many
  processes the calls crossed: the callee's part came back in the bridge form.

Attributes follow Triton's (`triton.model_name`, `triton.model_version`, `triton.request_id`).
Spans go out in batches (BatchSpanProcessor: Triton's `bsp_*` settings, else the SDK's
OTEL_BSP_* environment); the batch still queued is sent when the server exits.
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .config import TraceConfig
from .request import WireTrace

SERVICE_NAME = "triton-inference-server"  # Triton's default resource service.name
_PROPAGATOR = TraceContextTextMapPropagator()


class OtelExport:
    """The door's tracer provider and exporter."""

    def __init__(self, config: TraceConfig) -> None:
        resource = Resource.create({"service.name": SERVICE_NAME, **config.resource})
        self._provider = TracerProvider(resource=resource)
        self._provider.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=config.url),
                max_queue_size=config.bsp.get("max_queue_size"),
                schedule_delay_millis=config.bsp.get("schedule_delay_millis"),
                max_export_batch_size=config.bsp.get("max_export_batch_size"),
            )
        )
        self._tracer = self._provider.get_tracer("dynamo-bridge")
        # monotonic ns + this = wall-clock ns (OpenTelemetry's times are epoch ns).
        self._offset = time.time_ns() - time.monotonic_ns()

    def export(self, trace: WireTrace) -> None:
        """The spans of one finished request."""
        part = trace.part
        if part is None:
            return
        parent: Context | None = None
        if trace.traceparent:
            parent = _PROPAGATOR.extract({"traceparent": trace.traceparent})
        times = trace.times
        model_times = part.get("times", {})
        start = min(times.values(), default=model_times.get("REQUEST_START", time.monotonic_ns()))
        end = max(times.values(), default=model_times.get("REQUEST_END", start))
        root = self._tracer.start_span(
            "InferRequest",
            context=parent,
            start_time=start + self._offset,
            attributes={"triton.protocol": trace.wire},
        )
        for name, ns in sorted(times.items(), key=lambda kv: kv[1]):
            root.add_event(name, timestamp=ns + self._offset)
        self._model_span(part, root, trace.request_id)
        root.end(end_time=end + self._offset)

    def _model_span(self, part: dict[str, Any], parent: Span, request_id: str) -> None:
        times = part.get("times", {})
        start, end = times.get("REQUEST_START"), times.get("REQUEST_END")
        if start is None:
            return
        end = end if end is not None else start
        attributes: dict[str, Any] = {
            "triton.model_name": part.get("model_name", ""),
            "triton.model_version": int(part.get("model_version", -1)),
        }
        if request_id:
            attributes["triton.request_id"] = request_id
        if part.get("kind"):
            attributes["triton.trace_kind"] = part["kind"]
        context = set_span_in_context(parent)
        span = self._tracer.start_span(
            str(part.get("model_name", "")),
            context=context,
            start_time=start + self._offset,
            attributes=attributes,
        )
        inner = set_span_in_context(span)
        queue, compute, compute_end = (
            times.get("QUEUE_START"),
            times.get("COMPUTE_START"),
            times.get("COMPUTE_END"),
        )
        if queue is not None and compute is not None:
            self._tracer.start_span("queue", context=inner, start_time=queue + self._offset).end(
                end_time=compute + self._offset
            )
        compute_span = None
        if compute is not None and compute_end is not None:
            compute_span = self._tracer.start_span(
                "compute", context=inner, start_time=compute + self._offset
            )
            for name in ("COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START"):
                if name in times:
                    compute_span.add_event(name, timestamp=times[name] + self._offset)
        for child in part.get("children", ()):
            # A BLS call is made by `execute`: under compute; an ensemble step under the model.
            under = compute_span if child.get("kind") == "BLS" and compute_span else span
            self._model_span(child, under, request_id)
        if compute_span is not None and compute_end is not None:
            compute_span.end(end_time=compute_end + self._offset)
        span.end(end_time=end + self._offset)

    def close(self) -> None:
        """Send what is still queued, then stop."""
        self._provider.shutdown()
