"""`pb_utils.Logger`: model log lines, tagged with the calling file's name and line.

Records go to the standard `logging` logger "triton.model"; the bridge decides how to print them
(Triton's form is `I1121 09:23:01.443324 8705 model.py:21] "msg"`). VERBOSE maps to DEBUG.
"""

from __future__ import annotations

import enum
import logging
import sys
from typing import Any

from .errors import pybind_type_error

LOGGER_NAME = "triton.model"
_logger = logging.getLogger(LOGGER_NAME)


class LogLevel(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3

    def __str__(self) -> str:  # pybind11 style: "LogLevel.INFO"
        return f"LogLevel.{self.name}"

    def __repr__(self) -> str:
        return f"<LogLevel.{self.name}: {self.value}>"


_PYTHON_LEVELS = {
    LogLevel.INFO: logging.INFO,
    LogLevel.WARNING: logging.WARNING,
    LogLevel.ERROR: logging.ERROR,
    LogLevel.VERBOSE: logging.DEBUG,
}
_LOG_SIGNATURE = (
    "(message: str, level: c_python_backend_utils.Logger.LogLevel = <LogLevel.INFO: 0>) -> None"
)
_ONE_ARG_SIGNATURE = "(message: str) -> None"


def _emit(message: str, level: LogLevel) -> None:
    python_level = _PYTHON_LEVELS[level]
    if not _logger.isEnabledFor(python_level):
        return
    # Two frames up: the model code that called Logger.log / log_info / ...
    frame = sys._getframe(2)
    code = frame.f_code
    record = _logger.makeRecord(
        LOGGER_NAME,
        python_level,
        code.co_filename,
        frame.f_lineno,
        message,
        (),
        None,
        code.co_name,
    )
    _logger.handle(record)


def _message(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):  # pybind's str caster takes bytes too
        return value.decode()
    return None


class Logger:
    """Static methods only, as in Triton: `Logger.log_info("...")`, `Logger.log(msg, level)`."""

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(*args: Any, **kwargs: Any) -> None:
        # message: str, level: LogLevel = INFO. A plain int (or None) level is a TypeError [V].
        message = level = None
        if len(args) <= 2 and set(kwargs) <= {"message", "level"}:
            values = dict(zip(("message", "level"), args, strict=False))
            if not set(values) & set(kwargs):
                values.update(kwargs)
                message = _message(values.get("message"))
                level = values.get("level", LogLevel.INFO)
        if message is None or not isinstance(level, LogLevel):
            raise pybind_type_error("log", _LOG_SIGNATURE, args, kwargs)
        _emit(message, level)

    @staticmethod
    def log_info(*args: Any, **kwargs: Any) -> None:
        _emit(_one_message("log_info", args, kwargs), LogLevel.INFO)

    @staticmethod
    def log_warn(*args: Any, **kwargs: Any) -> None:
        _emit(_one_message("log_warn", args, kwargs), LogLevel.WARNING)

    @staticmethod
    def log_error(*args: Any, **kwargs: Any) -> None:
        _emit(_one_message("log_error", args, kwargs), LogLevel.ERROR)

    @staticmethod
    def log_verbose(*args: Any, **kwargs: Any) -> None:
        _emit(_one_message("log_verbose", args, kwargs), LogLevel.VERBOSE)


def _one_message(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    value = args[0] if len(args) == 1 and not kwargs else kwargs.get("message")
    message = _message(value) if len(args) + len(kwargs) == 1 else None
    if message is None:
        raise pybind_type_error(name, _ONE_ARG_SIGNATURE, args, kwargs)
    return message
