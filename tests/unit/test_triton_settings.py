"""LogSettings / TraceSetting rules with no server (bridge/logs.py,
frontends/triton/log_trace_settings.py).

The expected answers are Triton 2.51's, as tests/differential/test_diff_settings.py checks them
against the real server; here they hold where the oracle is not installed.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from bridge import logs
from bridge.frontends.triton.door_error import DoorError
from bridge.frontends.triton.log_trace_settings import TraceSettings
from bridge.tracing.config import join_mode_parts, parse_trace_config
from model_repository_loader.pb_utils.errors import ErrorCode

BAD_FORMAT = (ErrorCode.INVALID_ARG, "invalid argument for log_format, got: bad")


@pytest.mark.parametrize(
    "changes, valid, error",
    [
        ({}, {}, None),
        ({"nope": 1}, {}, None),
        ({"log_info": False}, {"log_info": False}, None),
        ({"log_info": 1}, {}, (ErrorCode.INVALID_ARG, "expect boolean for 'log_info'")),
        ({"log_warning": None}, {}, (ErrorCode.INVALID_ARG, "expect boolean for 'log_warning'")),
        ({"log_verbose_level": True}, {}, (ErrorCode.INVALID_ARG, "expect int32 for 'log_verbose_level'")),  # noqa: E501
        ({"log_verbose_level": 2**40 + 3}, {"log_verbose_level": 3}, None),
        ({"log_format": "bad"}, {}, BAD_FORMAT),
        ({"log_file": ""}, {}, (ErrorCode.UNSUPPORTED, logs.LOG_FILE_FIXED)),
        # Triton's order: the keys before the bad one apply, those after do not.
        ({"log_format": "bad", "log_error": False}, {"log_error": False}, BAD_FORMAT),
        (
            {"log_verbose_level": 3, "log_info": "x"},
            {},
            (ErrorCode.INVALID_ARG, "expect boolean for 'log_info'"),
        ),
    ],
)
def test_check_log_settings(changes, valid, error):
    assert logs.check_log_settings(changes) == (valid, error)


@pytest.fixture
def restored_logging():
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    before = logs.log_settings()
    yield
    logs.apply_log_settings({k: v for k, v in before.items() if k != "log_file"})
    root.setLevel(level)
    root.handlers[:] = handlers


def test_settings_switch_levels_and_format(restored_logging, capsys):
    logs.configure_logging(0)
    log = logging.getLogger("test.settings")
    log.debug("verbose-1")
    logs.apply_log_settings({"log_verbose_level": 1, "log_warning": False})
    log.debug("verbose-2")
    log.warning("warning-2")
    logs.apply_log_settings({"log_format": "ISO8601", "log_verbose_level": 0})
    log.info("info-3")
    err = capsys.readouterr().err
    assert "verbose-1" not in err and "verbose-2" in err and "warning-2" not in err
    line = next(line for line in err.splitlines() if "info-3" in line)
    assert line[4] == "-" and line[10] == "T"  # 2026-11-25T...: the ISO8601 stamp


def trace_update(settings: TraceSettings, model: str, changes: dict) -> object:
    try:
        return asyncio.run(settings.update(model, changes))
    except DoorError as exc:
        return (exc.code, exc.message)


def test_trace_settings_global_and_per_model():
    trace = TraceSettings()
    assert trace.current()["trace_rate"] == ["1000"]
    assert trace_update(trace, "", {"trace_rate": ["5"]})["trace_rate"] == ["5"]
    assert trace_update(trace, "m", {"trace_rate": ["7"]})["trace_rate"] == ["7"]
    assert trace.current("m")["trace_rate"] == ["7"] and trace.current()["trace_rate"] == ["5"]
    assert trace_update(trace, "m", {"trace_rate": None})["trace_rate"] == ["5"]
    assert trace_update(trace, "", {"trace_rate": []})["trace_rate"] == ["1000"]
    assert trace_update(trace, "", {"trace_rate": ["-3"]})["trace_rate"] == ["4294967293"]
    assert trace_update(trace, "", {"log_frequency": [" 2.5"]})["log_frequency"] == ["2"]
    assert trace_update(trace, "", {"trace_mode": ["opentelemetry"], "x": ["1"]}) == trace.current()


@pytest.mark.parametrize(
    "changes, code, message",
    [
        ({"trace_count": ["-5"]}, ErrorCode.INVALID_ARG,
         "Unable to parse 'trace_count'. Expecting value >= -1, got: -5"),
        ({"trace_rate": ["abc"]}, ErrorCode.INVALID_ARG, "Unable to parse 'trace_rate', got: abc"),
        ({"trace_rate": ["1", "2"]}, ErrorCode.INVALID_ARG, "expect only 1 value for 'trace_rate'"),
        ({"trace_level": ["OFF", "TIMESTAMPS"]}, ErrorCode.INVALID_ARG,
         "Expect only one trace level 'OFF' is specified"),
        ({"trace_file": None}, ErrorCode.UNSUPPORTED,
         "trace file location can not be updated through network protocol"),
        ({"trace_level": ["TENSORS"]}, ErrorCode.INVALID_ARG,
         "Attempting to set invalid trace setting :trace file name is not given"),
    ],
)  # fmt: skip
def test_trace_settings_refusals(changes, code, message):
    trace = TraceSettings()
    assert trace_update(trace, "", changes) == (code, message)
    assert trace.current() == TraceSettings().current()  # nothing changed


def test_trace_config_flags_as_tritonserver():
    config = parse_trace_config(
        ["triton,file=/tmp/t.json", "level=TIMESTAMPS", "level=tensors", "rate=1",
         "count=5", "triton,log-frequency=2", "zzz=1"]
    )  # fmt: skip
    assert (config.levels, config.rate, config.count, config.log_frequency, config.file) == (
        ("TIMESTAMPS", "TENSORS"), 1, 5, 2, "/tmp/t.json"
    )
    assert parse_trace_config(["level=TIMESTAMPS", "level=OFF"]).levels == ()  # OFF wins
    otel = parse_trace_config(
        ["mode=opentelemetry", "opentelemetry,url=http://h:1/v1/traces",
         "opentelemetry,resource=service.name=x", "triton,file=/ignored"]
    )  # fmt: skip
    assert (otel.mode, otel.url, otel.resource, otel.file) == (
        "opentelemetry", "http://h:1/v1/traces", {"service.name": "x"}, ""
    )


@pytest.mark.parametrize(
    "arg, message",
    [
        (",rate=1", "No trace mode specified. --trace-config option format is "
         "<trace mode>,<setting>=<value> or <setting>=<value>. Got ,rate=1"),
        ("rate", "--trace-config option format is '<trace mode>,<setting>=<value>'. Got rate"),
        ("level=loud", 'Bad option: "--trace-config level".\n'
         "invalid value for trace level option: loud"),
        ("zipkin,url=x", "invalid value for trace mode option: zipkin. Available options are "
         '"triton" and "opentelemetry"'),
    ],
)  # fmt: skip
def test_trace_config_refusals(arg, message):
    with pytest.raises(ValueError) as caught:
        parse_trace_config([arg])
    assert str(caught.value) == message


def test_trace_settings_sample_by_rate_and_count(tmp_path):
    config = parse_trace_config(
        [f"triton,file={tmp_path / 't.json'}", "level=TIMESTAMPS", "rate=2", "count=2"]
    )
    trace = TraceSettings(config=config)
    picks = [trace.sample("m") is not None for _ in range(7)]
    assert picks == [False, True, False, True, False, False, False]
    assert trace.current()["trace_count"] == ["0"]  # what is left, as Triton reports it
    off = TraceSettings()
    assert not off.active and off.sample("m") is None


def test_trace_config_environment_form():
    parts = "triton,file=/t.json,level=TIMESTAMPS,opentelemetry,url=http://h/v1/traces".split(",")
    assert join_mode_parts(parts) == [
        "triton,file=/t.json",
        "level=TIMESTAMPS",
        "opentelemetry,url=http://h/v1/traces",
    ]
