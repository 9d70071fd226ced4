"""LogSettings and TraceSetting, step by step against Triton 2.51 (the triton door only).

Each test sends the same sequence of changes to a Triton and a door of their own (settings are
per server, so the shared servers of the other tests stay untouched) and compares every answer:
the settings after the change, or the status and text of the refusal. Trace settings with a
trace file configured, and the traces themselves, are in test_diff_tracing.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tests.differential.support import REPOSITORIES, TRITON_DOOR

pytestmark = [
    pytest.mark.oracle,
    pytest.mark.skipif(not TRITON_DOOR, reason="Dynamo's frontend: LogSettings is UNIMPLEMENTED"),
]

REPO = REPOSITORIES / "scale_out"  # one model: whoami
MODEL = "whoami"
Stub = service_pb2_grpc.GRPCInferenceServiceStub


@pytest.fixture(scope="module")
def stubs(oracle_server, shared_bridge_server) -> tuple[Stub, Stub]:
    # Extra flags that change nothing but make these servers the module's own.
    oracle = oracle_server(REPO, "--log-warning=true")
    bridge = shared_bridge_server(REPO, "--frontend", "triton", "--log-format", "default")
    return (
        Stub(grpc.insecure_channel(oracle.grpc_url)),
        Stub(grpc.insecure_channel(bridge.grpc_url)),
    )


def outcome(method: Callable[[Any], Any], request: Any) -> Any:
    """The settings an RPC answered, or its status and text."""
    try:
        response = method(request)
    except grpc.RpcError as exc:
        return (str(exc.code()), exc.details())
    return {key: _value(value) for key, value in sorted(response.settings.items())}


def _value(value: Any) -> Any:
    if isinstance(value, pb.TraceSettingResponse.SettingValue):
        return list(value.value)
    kind = value.WhichOneof("parameter_choice")
    return (kind, getattr(value, kind))


def log_request(**settings: Any) -> pb.LogSettingsRequest:
    request = pb.LogSettingsRequest()
    for key, value in settings.items():
        target = request.settings[key]
        if value is None:
            target.SetInParent()
        elif isinstance(value, bool):
            target.bool_param = value
        elif isinstance(value, int):
            target.uint32_param = value
        else:
            target.string_param = value
    return request


def trace_request(model: str = "", **settings: list[str] | None) -> pb.TraceSettingRequest:
    request = pb.TraceSettingRequest(model_name=model)
    for key, values in settings.items():
        request.settings[key].SetInParent()
        request.settings[key].value.extend(values or ())
    return request


LOG_STEPS: list[dict[str, Any]] = [
    {},
    {"log_info": False},
    {"log_info": 1},
    {"log_info": "x"},
    {"log_warning": None},
    {"log_verbose_level": 2},
    {"log_verbose_level": True},
    {"log_verbose_level": "1"},
    {"log_format": "ISO8601"},
    {"log_format": "bad"},
    {"log_format": True},
    {"log_file": "/tmp/elsewhere.log"},
    {"log_file": ""},
    {"nope": True},
    # a bad value keeps the changes of the keys Triton checks before it, not those after
    {"log_error": False, "log_format": "bad"},
    {"log_verbose_level": 3, "log_info": "bad"},
    {"log_info": True, "log_file": ""},
    {"log_info": True, "log_warning": True, "log_error": True, "log_verbose_level": 0},
    {"log_format": "default"},
    {},
]


def test_log_settings_as_triton(stubs):
    oracle, door = stubs
    for step in LOG_STEPS:
        request = log_request(**step)
        expected = outcome(oracle.LogSettings, request)
        got = outcome(door.LogSettings, request)
        assert got == expected, step


TRACE_STEPS: list[tuple[str, dict[str, list[str] | None]]] = [
    ("", {}),
    ("nonexistent", {}),
    ("", {"trace_rate": ["5"]}),
    (MODEL, {}),
    (MODEL, {"trace_rate": ["7"]}),
    (MODEL, {}),
    ("", {}),
    (MODEL, {"trace_rate": None}),
    (MODEL, {"trace_count": ["-5"]}),
    (MODEL, {"trace_count": ["12"], "log_frequency": ["2.5"]}),
    ("", {"trace_rate": ["-3"]}),
    ("", {"trace_rate": ["99999999999999"]}),
    ("", {"trace_rate": ["1", "2"]}),
    ("", {"trace_rate": [" 4x"]}),
    ("", {"trace_rate": ["abc"]}),
    ("", {"trace_rate": []}),
    ("", {"trace_level": ["OFF"]}),
    ("", {"trace_level": ["OFF", "TIMESTAMPS"]}),
    ("", {"trace_level": ["BAD"]}),
    ("", {"trace_level": None}),
    ("", {"trace_mode": ["opentelemetry"], "nope": ["1"]}),
    (MODEL, {"trace_file": ["/tmp/trace.json"]}),
    ("", {"trace_file": None}),
    (MODEL, {}),
    ("", {}),
]


def test_trace_settings_as_triton(stubs):
    oracle, door = stubs
    for model, step in TRACE_STEPS:
        request = trace_request(model, **step)
        expected = outcome(oracle.TraceSetting, request)
        got = outcome(door.TraceSetting, request)
        assert got == expected, (model, step)


@pytest.mark.parametrize("level", ["TIMESTAMPS", "TENSORS"])
def test_trace_level_without_a_trace_file(stubs, level):
    """With no trace file configured, a level other than OFF could trace nothing: both refuse it
    (INVALID_ARGUMENT, Triton's text) and nothing changes."""
    oracle, door = stubs
    request = trace_request(trace_level=[level])
    triton = outcome(oracle.TraceSetting, request)
    assert triton == (
        "StatusCode.INVALID_ARGUMENT",
        "Attempting to set invalid trace setting :trace file name is not given",
    )
    assert outcome(door.TraceSetting, request) == triton
    read = trace_request()
    assert outcome(door.TraceSetting, read) == outcome(oracle.TraceSetting, read)
