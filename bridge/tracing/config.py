"""`--trace-config` as tritonserver 2.51 reads it (src/command_line_parser.cc).

Each flag is `<setting>=<value>` (a global setting: `level`, `rate`, `count`, `mode`) or
`<mode>,<setting>=<value>` (`triton,file=...`, `triton,log-frequency=...`,
`opentelemetry,url=...`, `opentelemetry,resource=key=value`, `opentelemetry,bsp_*=N`). Levels
add up (TIMESTAMPS and TENSORS both), an explicit OFF wins over every other level, unknown
settings are ignored, and a bad value is Triton's ParseException text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LEVEL_NAMES = ("TIMESTAMPS", "TENSORS")  # Triton's order in the settings it answers
_TIMESTAMPS_WORDS = ("true", "on", "min", "max", "timestamps")
MODES = ("triton", "opentelemetry")
_INT32 = (-(2**31), 2**31 - 1)
# Triton's BatchSpanProcessor settings → the OpenTelemetry SDK's argument names.
_BSP = {
    "bsp_max_queue_size": "max_queue_size",
    "bsp_schedule_delay": "schedule_delay_millis",
    "bsp_max_export_batch_size": "max_export_batch_size",
}


@dataclass(frozen=True, slots=True)
class TraceConfig:
    """The start-up trace settings (Triton's defaults when no flag is given)."""

    levels: tuple[str, ...] = ()  # empty: OFF
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    file: str = ""
    mode: str = "triton"
    # opentelemetry mode: where spans go (OTLP/HTTP) and the resource attributes they carry.
    url: str = "http://localhost:4318/v1/traces"
    resource: dict[str, str] = field(default_factory=dict)
    # BatchSpanProcessor settings given as `opentelemetry,bsp_*=N` (the SDK's names).
    bsp: dict[str, int] = field(default_factory=dict)


def _int(text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"invalid value for integer option: {text}") from None
    if not _INT32[0] <= value <= _INT32[1]:
        raise ValueError(f"invalid value for integer option: {text}")
    return value


def _level(text: str) -> str:
    word = text.lower()
    if word in ("false", "off"):
        return "OFF"
    if word in _TIMESTAMPS_WORDS:
        return "TIMESTAMPS"
    if word == "tensors":
        return "TENSORS"
    raise ValueError(f"invalid value for trace level option: {text}")


def _mode(text: str) -> str:
    if text.lower() not in MODES:
        raise ValueError(
            f"invalid value for trace mode option: {text}. Available options are "
            '"triton" and "opentelemetry"'
        )
    return text.lower()


def _split(arg: str) -> tuple[str, str, str]:
    """(mode or "", setting, value), or Triton's format error."""
    mode = ""
    rest = arg
    comma = arg.find(",")
    if comma == 0:
        raise ValueError(
            "No trace mode specified. --trace-config option format is "
            f"<trace mode>,<setting>=<value> or <setting>=<value>. Got {arg}"
        )
    if comma > 0:
        mode, rest = _mode(arg[:comma]), arg[comma + 1 :]
    setting, equals, value = rest.partition("=")
    if not equals or not setting or not value:
        raise ValueError(
            f"--trace-config option format is '<trace mode>,<setting>=<value>'. Got {arg}"
        )
    return mode, setting, value


def parse_trace_config(args: list[str]) -> TraceConfig:
    """The settings `args` (each one `--trace-config` value) give; ValueError with Triton's
    words for a bad one."""
    by_mode: dict[str, list[tuple[str, str]]] = {}
    for arg in args:
        mode, setting, value = _split(arg)
        by_mode.setdefault(mode, []).append((setting, value))
    levels: set[str] = set()
    values: dict[str, object] = {}
    for setting, value in by_mode.get("", []):
        try:
            if setting == "rate":
                values["rate"] = _int(value)
            elif setting == "level":
                levels.add(_level(value))
            elif setting == "mode":
                values["mode"] = _mode(value)
            elif setting == "count":
                values["count"] = _int(value)
        except ValueError as exc:
            raise ValueError(f'Bad option: "--trace-config {setting}".\n{exc}') from None
    mode = str(values.get("mode", "triton"))
    if mode == "triton":
        for setting, value in by_mode.get("triton", []):
            try:
                if setting == "file":
                    values["file"] = value
                elif setting == "log-frequency":
                    values["log_frequency"] = _int(value)
            except ValueError as exc:
                raise ValueError(f'Bad option: "--trace-config triton,{setting}".\n{exc}') from None
    else:
        resource: dict[str, str] = {}
        bsp: dict[str, int] = {}
        for setting, value in by_mode.get("opentelemetry", []):
            if setting == "url":
                values["url"] = value
            elif setting == "resource":
                key, _, attribute = value.partition("=")
                resource[key] = attribute
            elif setting in _BSP:
                try:
                    number = _int(value)
                    if number < 0:
                        raise ValueError(f"invalid value for integer option: {value}")
                except ValueError as exc:
                    raise ValueError(
                        f'Bad option: "--trace-config opentelemetry,{setting}".\n{exc}'
                    ) from None
                bsp[_BSP[setting]] = number
        values["resource"] = resource
        values["bsp"] = bsp
    chosen = () if "OFF" in levels else tuple(n for n in LEVEL_NAMES if n in levels)
    return TraceConfig(levels=chosen, **values)  # type: ignore[arg-type]


def join_mode_parts(parts: list[str]) -> list[str]:
    """`DYN_BRIDGE_TRACE_CONFIG=triton,file=/t.json,level=TIMESTAMPS` split at its commas: a
    mode name joins the setting after it again (`triton,file=/t.json`)."""
    joined: list[str] = []
    for part in parts:
        if joined and joined[-1].lower() in MODES:
            joined[-1] += "," + part
        else:
            joined.append(part)
    return joined
