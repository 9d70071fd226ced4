"""Triton's log and trace settings (LogSettings / TraceSetting, `/v2/logging`, `/v2/trace/setting`).

Log settings are real: a change applies to the door's process and goes to every bridge worker
over the control endpoint (`{"op": "log_settings"}`, docs/worker_protocol.md §1), so a
`--role frontend` door and its workers change together. What each key does here is in
bridge/logs.py; the keys, types, order and texts are Triton 2.51's [V]: unknown keys are ignored,
a bad value is INVALID_ARG and keeps the changes of the keys Triton checks before it, `log_file`
cannot change (UNSUPPORTED, Triton's text). A worker that joins later (the directory sees a new
control instance) gets every change made through the door so far.

Trace settings: the bridge records no Triton traces, so it answers as Triton does with tracing
off (`trace_level` OFF, no trace file) [V]: the numbers (`trace_rate`, `trace_count`,
`log_frequency`) are checked and kept per model and globally as Triton keeps them, which is all
they do while nothing is traced; a level other than OFF would need traces and is UNSUPPORTED with
our text; `trace_file` is Triton's UNSUPPORTED; `trace_mode` and unknown keys are ignored, as
Triton ignores them.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import TYPE_CHECKING

from model_repository_loader.pb_utils.errors import ErrorCode

from ...logs import apply_log_settings, check_log_settings, log_settings
from .status import DoorError

if TYPE_CHECKING:
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
            {"op": "log_settings", "settings": changes}, instance_ids=instance_ids
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
NO_TRACES = (
    "trace_level {levels}: dynamo-bridge records no Triton traces; only trace_level OFF is "
    "supported"
)
_UINT32_MAX = 2**32 - 1
_INT32_MAX = 2**31 - 1
# What C's strtol reads: leading blanks, a sign, digits; the rest is ignored (" 4x" is 4) [V].
_NUMBER = re.compile(r"\s*([+-]?\d+)")


def _parse_number(key: str, text: str) -> str:
    match = _NUMBER.match(text)
    if match is None:
        raise DoorError(ErrorCode.INVALID_ARG, f"Unable to parse '{key}', got: {text}")
    value = int(match.group(1))
    if key == "trace_count":
        if value > _INT32_MAX:
            raise DoorError(
                ErrorCode.INVALID_ARG,
                f"Unable to parse '{key}', value is out of range [ -1, {_INT32_MAX} ], "
                f"got: {text}",
            )
        if value < -1:
            raise DoorError(
                ErrorCode.INVALID_ARG,
                f"Unable to parse '{key}'. Expecting value >= -1, got: {text}",
            )
        return str(value)
    if value > _UINT32_MAX:
        raise DoorError(
            ErrorCode.INVALID_ARG,
            f"Unable to parse '{key}', value is out of range [ 0, {_UINT32_MAX} ], got: {text}",
        )
    return str(value & _UINT32_MAX)  # a negative rate wraps, as Triton's unsigned parse does


def _parse_level(values: list[str]) -> list[str]:
    levels = [v for v in values if v in TRACE_LEVELS]  # Triton skips names it does not know
    if "OFF" in levels and len(values) > 1:
        raise DoorError(ErrorCode.INVALID_ARG, "Expect only one trace level 'OFF' is specified")
    traced = [v for v in levels if v != "OFF"]
    if traced:
        raise DoorError(ErrorCode.UNSUPPORTED, NO_TRACES.format(levels=", ".join(traced)))
    return ["OFF"]


class TraceSettings:
    """Triton's trace settings, globally and per model, with tracing always off."""

    def __init__(self, directory: Directory | None = None) -> None:
        self._directory = directory
        self._global: dict[str, list[str]] = {}
        self._models: dict[str, dict[str, list[str]]] = {}

    def current(self, model: str = "") -> dict[str, list[str]]:
        """The settings a model (or, with "", the server) has: its own over the global ones
        over Triton's defaults. No check that the model exists (`update(model, {})` checks)."""
        merged = {key: list(value) for key, value in TRACE_DEFAULTS.items()}
        merged.update(self._global)
        if model:
            merged.update(self._models.get(model, {}))
        return merged

    async def update(
        self, model: str, changes: dict[str, list[str] | None]
    ) -> dict[str, list[str]]:
        """Apply `changes` (None or [] clears a setting back to the global one, or for the
        global settings to Triton's default); the settings after them, or DoorError. Checked
        in full before any applies. `changes` empty: read, with Triton's unknown-model check."""
        if model and self._directory is not None:
            known = await self._directory.fresh()
            if model not in known:
                raise DoorError(ErrorCode.INVALID_ARG, f"Request for unknown model : {model}")
        if "trace_file" in changes:
            raise DoorError(ErrorCode.UNSUPPORTED, TRACE_FILE_FIXED)
        parsed: dict[str, list[str] | None] = {}
        for key in ("trace_level", "trace_rate", "trace_count", "log_frequency"):
            if key not in changes:
                continue
            values = list(changes[key] or ())
            if not values:
                parsed[key] = None
            elif key == "trace_level":
                parsed[key] = _parse_level(values)
            elif len(values) > 1:
                raise DoorError(ErrorCode.INVALID_ARG, f"expect only 1 value for '{key}'")
            else:
                parsed[key] = [_parse_number(key, values[0])]
        own = self._models.setdefault(model, {}) if model else self._global
        for key, value in parsed.items():
            if value is None:
                own.pop(key, None)
            else:
                own[key] = value
        return self.current(model)
