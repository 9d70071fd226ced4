"""Triton's request tracing (`--trace-config`, TraceSetting, the trace file) and its
OpenTelemetry export.

`config.py`: `--trace-config` parsed as tritonserver parses it; `triton_file.py`: the trace file
in Triton's JSON shape, written as Triton writes it (log frequency, indexed files). The door's
settings and sampling are in frontends/triton/log_trace_settings.py; what a worker measures for one
request is model_repository_loader/tracing.py, carried back in the bridge form
(docs/worker_protocol.md §2).
"""
