"""Triton's log and trace settings (LogSettings / TraceSetting, `/v2/logging`, `/v2/trace/setting`).

Log settings are real: a change applies to the door's process and goes to every bridge worker
over the control endpoint (`{"op": "log_settings"}`, docs/worker_protocol.md §1), so a
`--role frontend` door and its workers change together. What each key does here is in
bridge/logs.py; the keys, types, order and texts are Triton 2.51's [V]: unknown keys are ignored,
a bad value is INVALID_ARG and keeps the changes of the keys Triton checks before it, `log_file`
cannot change (UNSUPPORTED, Triton's text). A worker that joins later (the directory sees a new
control instance) gets every change made through the door so far.

Trace settings start as `--trace-config` sets them (bridge/tracing/config.py) and change per
model and globally as Triton's TraceManager changes them [V]: a model's own settings over the
global ones over the start-up ones; a change is checked in full and refused with Triton's
INVALID_ARG "Attempting to set invalid trace setting :<why>" when the result could trace
nothing (no trace file, a rate of 0) and its level is not OFF; `trace_file` cannot change
(UNSUPPORTED, Triton's text); `trace_mode` and unknown keys are ignored. A global change
restarts the counters of the models that fall back on it. `sample()` says which request is
traced (bridge/tracing/setting.py), with nothing done per request while every level is OFF.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from model_repository_loader.pb_utils.errors import ErrorCode

from ...cluster.protocol import log_settings_request
from ...logs import apply_log_settings, check_log_settings, log_settings
from ...tracing.config import LEVEL_NAMES, TraceConfig
from ...tracing.request import WireTrace
from ...tracing.setting import TraceSetting, TraceValues
from ...tracing.triton_file import TraceFile
from .door_error import DoorError

if TYPE_CHECKING:
    from ...tracing.otel import OtelExport
    from .directory import Directory

log = logging.getLogger(__name__)

LogValue = bool | int | str


class LogSettings:
    """The door process's log settings, shared with the workers of its namespace."""

    def __init__(self, directory: Directory | None = None) -> None:
        self._directory = directory
        self._changed: dict[str, LogValue] = {}  # every change a client made, for new workers
        self._catching_up: set[asyncio.Task] = set()
        if directory is not None:
            directory.on_new_workers.append(self._catch_up)

    def current(self) -> dict[str, LogValue]:
        """Triton's six keys: `log_file`, `log_info`, `log_warning`, `log_error`,
        `log_verbose_level`, `log_format`."""
        return log_settings()

    async def update(self, changes: dict[str, LogValue | None]) -> dict[str, LogValue]:
        """Apply `changes` here and on every worker; the settings after them, or DoorError.

        A value of None is "no value given" (gRPC's empty SettingValue: Triton's type error);
        Triton's HTTP endpoint ignores JSON nulls, so the HTTP wire drops them before calling.
        """
        valid, error = check_log_settings(changes)
        if valid:
            apply_log_settings(valid)
            self._changed.update(valid)
            await self._tell_workers(valid)
        if error is not None:
            raise DoorError(*error)
        return self.current()

    def _catch_up(self, instance_ids: list[int]) -> None:
        """Workers that joined after a change get every change made so far."""
        if self._changed:
            task = asyncio.ensure_future(self._tell_workers(dict(self._changed), instance_ids))
            self._catching_up.add(task)
            task.add_done_callback(self._catching_up.discard)

    async def _tell_workers(
        self, changes: dict[str, LogValue], instance_ids: list[int] | None = None
    ) -> None:
        if self._directory is None:
            return
        answers = await self._directory.tell_every_worker(
            log_settings_request(changes), instance_ids=instance_ids
        )
        for answer in answers:
            if answer is None or "error" in answer:
                log.warning("a worker did not take the log settings %s: %r", changes, answer)


TRACE_DEFAULTS: dict[str, list[str]] = {
    "trace_level": ["OFF"],
    "trace_rate": ["1000"],
    "trace_count": ["-1"],
    "log_frequency": ["0"],
    "trace_file": [""],
    "trace_mode": ["triton"],
}
TRACE_LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
TRACE_FILE_FIXED = "trace file location can not be updated through network protocol"
INVALID_SETTING = "Attempting to set invalid trace setting :"
# W3C Trace Context: version 00, a trace id and a parent span id (neither all zeros), flags.
_TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
_UINT32_MAX = 2**32 - 1
_INT32_MAX = 2**31 - 1
# What C's strtol reads: leading blanks, a sign, digits; the rest is ignored (" 4x" is 4) [V].
_NUMBER = re.compile(r"\s*([+-]?\d+)")
# A network value's key, as TraceValues names it.
_FIELDS = {
    "trace_level": "levels",
    "trace_rate": "rate",
    "trace_count": "count",
    "log_frequency": "log_frequency",
}


def _parse_number(key: str, text: str) -> int:
    match = _NUMBER.match(text)
    if match is None:
        raise DoorError(ErrorCode.INVALID_ARG, f"Unable to parse '{key}', got: {text}")
    value = int(match.group(1))
    if key == "trace_count":
        if value > _INT32_MAX:
            raise DoorError(
                ErrorCode.INVALID_ARG,
                f"Unable to parse '{key}', value is out of range [ -1, {_INT32_MAX} ], got: {text}",
            )
        if value < -1:
            raise DoorError(
                ErrorCode.INVALID_ARG,
                f"Unable to parse '{key}'. Expecting value >= -1, got: {text}",
            )
        return value
    if value > _UINT32_MAX:
        raise DoorError(
            ErrorCode.INVALID_ARG,
            f"Unable to parse '{key}', value is out of range [ 0, {_UINT32_MAX} ], got: {text}",
        )
    return value & _UINT32_MAX  # a negative rate wraps, as Triton's unsigned parse does


def _parse_level(values: list[str]) -> tuple[str, ...]:
    levels = [v for v in values if v in TRACE_LEVELS]  # Triton skips names it does not know
    if "OFF" in levels and len(values) > 1:
        raise DoorError(ErrorCode.INVALID_ARG, "Expect only one trace level 'OFF' is specified")
    return tuple(name for name in LEVEL_NAMES if name in levels)


class TraceSettings:
    """Triton's trace settings, globally and per model, and which requests they trace."""

    def __init__(self, directory: Directory | None = None, config: TraceConfig | None = None):
        self._directory = directory
        config = config or TraceConfig()
        self._defaults = TraceValues(
            config.levels,
            config.rate,
            config.count,
            config.log_frequency,
            config.file,
            config.mode,
        )
        self._file = TraceFile(config.file) if config.file and config.mode == "triton" else None
        self._global_own: dict[str, object] = {}  # what clients set, by TraceValues field
        self._models_own: dict[str, dict[str, object]] = {}
        self._global = TraceSetting(self._defaults, self._file)
        self._models: dict[str, TraceSetting] = {}
        self.active = not self._global.reason  # False: no request is traced (the fast path)
        # OpenTelemetry mode: where finished traces go instead of the trace file.
        self._otel: OtelExport | None = None
        self.export: Callable[[WireTrace], None] | None = None
        if config.mode == "opentelemetry":
            from ...tracing.otel import OtelExport  # the SDK only when asked for

            self._otel = OtelExport(config)
            self.export = self._otel.export

    def _setting(self, model: str) -> TraceSetting:
        return self._models.get(model, self._global) if model else self._global

    def current(self, model: str = "") -> dict[str, list[str]]:
        """The settings a model (or, with "", the server) has: its own over the global ones
        over the start-up ones. No check that the model exists (`update(model, {})` checks)."""
        setting = self._setting(model)
        values = setting.values
        return {
            "trace_level": list(values.levels) or ["OFF"],
            "trace_rate": [str(values.rate)],
            "trace_count": [str(setting.count)],
            "log_frequency": [str(values.log_frequency)],
            "trace_file": [values.file],
            "trace_mode": [values.mode],
        }

    def sample(self, model: str, force: bool = False) -> TraceSetting | None:
        """The setting that traces this request for `model`, or None (most requests)."""
        if not self.active:
            return None
        setting = self._models.get(model, self._global)
        return setting if setting.sample(force) else None

    def start(self, model: str, wire: str, traceparent: str = "") -> WireTrace | None:
        """A trace for this request to `model` through `wire` ("HTTP", "GRPC"), or None.
        Callers test `active` first, so that a server with tracing off does nothing more.

        In OpenTelemetry mode a request with a valid `traceparent` is always traced, as a child
        of the client's span (Triton forces the sample then [tracer.cc])."""
        propagated = self._otel is not None and _TRACEPARENT.fullmatch(traceparent) is not None
        setting = self.sample(model, force=propagated)
        if setting is None:
            return None
        trace = WireTrace(setting, wire, self.export)
        if propagated:
            trace.traceparent = traceparent
        return trace

    async def update(
        self, model: str, changes: dict[str, list[str] | None]
    ) -> dict[str, list[str]]:
        """Apply `changes` (None or [] clears a setting back to the global one, or for the
        global settings to the start-up one); the settings after them, or DoorError. Checked
        in full before any applies. `changes` empty: read, with Triton's unknown-model check."""
        if model and self._directory is not None:
            known = await self._directory.fresh()
            if model not in known:
                raise DoorError(ErrorCode.INVALID_ARG, f"Request for unknown model : {model}")
        if "trace_file" in changes:
            raise DoorError(ErrorCode.UNSUPPORTED, TRACE_FILE_FIXED)
        parsed: dict[str, object | None] = {}
        for key in ("trace_level", "trace_rate", "trace_count", "log_frequency"):
            if key not in changes:
                continue
            values = list(changes[key] or ())
            if not values:
                parsed[_FIELDS[key]] = None
            elif key == "trace_level":
                parsed[_FIELDS[key]] = _parse_level(values)
            elif len(values) > 1:
                raise DoorError(ErrorCode.INVALID_ARG, f"expect only 1 value for '{key}'")
            else:
                parsed[_FIELDS[key]] = _parse_number(key, values[0])
        if not parsed:
            return self.current(model)
        own = dict(self._models_own.get(model, {}) if model else self._global_own)
        for field_name, value in parsed.items():
            if value is None:
                own.pop(field_name, None)
            else:
                own[field_name] = value
        fresh = self._build(own if not model else {**self._global_own, **own})
        if fresh.reason and fresh.values.levels:
            raise DoorError(ErrorCode.INVALID_ARG, INVALID_SETTING + fresh.reason)
        if model:
            old = self._models.pop(model, None)
            if own:
                self._models_own[model] = own
                self._models[model] = fresh
            else:  # nothing of its own left: the model follows the global setting
                self._models_own.pop(model, None)
            if old is not None:
                old.retire()
        else:
            self._global_own = own
            old_global, self._global = self._global, fresh
            old_global.retire()
            for name, model_own in self._models_own.items():  # they fall back on it
                self._models[name].retire()
                self._models[name] = self._build({**own, **model_own})
        self.active = any(not s.reason for s in (self._global, *self._models.values()))
        return self.current(model)

    def _build(self, own: dict[str, object]) -> TraceSetting:
        return TraceSetting(dataclasses.replace(self._defaults, **own), self._file)  # type: ignore[arg-type]

    def close(self) -> None:
        """The server exits: collected traces go to the file, which is closed."""
        for setting in (self._global, *self._models.values()):
            setting.retire()
        if self._file is not None:
            self._file.close()
        if self._otel is not None:
            self._otel.close()
