"""pb_utils.TritonError, TritonModelException and Logger ([V] = observed on Triton 2.51)."""

from __future__ import annotations

import logging
import sys

import pytest

from model_repository_loader.pb_utils import Logger, TritonError, TritonModelException

# -- TritonError ----------------------------------------------------------------------------------


def test_error_codes() -> None:
    # [V] [0, 1, 2, 3, 4, 5, 6, 7] in this order.
    names = (
        "UNKNOWN INTERNAL NOT_FOUND INVALID_ARG UNAVAILABLE UNSUPPORTED ALREADY_EXISTS CANCELLED"
    )
    assert [int(getattr(TritonError, n)) for n in names.split()] == list(range(8))


def test_default_code_and_accessors() -> None:
    error = TritonError("m")
    assert error.message() == "m"
    # [V] (<__ErrorCode.INTERNAL: 1>, 1, '__ErrorCode.INTERNAL')
    assert error.code() == TritonError.INTERNAL
    assert int(error.code()) == 1
    assert str(error.code()) == "__ErrorCode.INTERNAL"
    assert repr(error.code()) == "<__ErrorCode.INTERNAL: 1>"
    # [V] TritonError.INTERNAL == 1 is True.
    assert TritonError.INTERNAL == 1


def test_keywords() -> None:
    assert TritonError(message="m", code=TritonError.NOT_FOUND).code() == TritonError.NOT_FOUND


def test_not_an_exception() -> None:
    assert not isinstance(TritonError("m"), Exception)  # [V]


@pytest.mark.parametrize(("args", "invoked"), [(("m", 1), "'m', 1"), ((None,), "None"), ((), "")])
def test_plain_int_code_or_none_message_is_a_type_error(args: tuple, invoked: str) -> None:
    # [V] exact text for ("m", 1) and (None,).
    with pytest.raises(TypeError) as info:
        TritonError(*args)
    assert str(info.value) == (
        "__init__(): incompatible constructor arguments. The following argument types are "
        "supported:\n    1. c_python_backend_utils.TritonError(message: str, code: "
        "c_python_backend_utils.TritonError.__ErrorCode = <__ErrorCode.INTERNAL: 1>)\n\n"
        f"Invoked with: {invoked}"
    )


# -- TritonModelException -------------------------------------------------------------------------


def test_model_exception() -> None:
    # [V] plain Exception subclass; str() is the message; args kept.
    assert issubclass(TritonModelException, Exception)
    assert str(TritonModelException("m")) == "m"
    assert TritonModelException("a", "b").args == ("a", "b")
    assert type(TritonModelException("m")).__name__ == "TritonModelException"


# -- Logger ---------------------------------------------------------------------------------------


def test_levels() -> None:
    # [V] ('LogLevel.INFO', 3, 'LogLevel', <LogLevel.WARNING: 1>)
    assert str(Logger.INFO) == "LogLevel.INFO"
    assert int(Logger.VERBOSE) == 3
    assert type(Logger.INFO).__name__ == "LogLevel"
    assert Logger.LogLevel.WARNING is Logger.WARNING
    assert [int(x) for x in (Logger.INFO, Logger.WARNING, Logger.ERROR, Logger.VERBOSE)] == [
        0,
        1,
        2,
        3,
    ]


def test_records_carry_the_calling_file_and_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="triton.model")
    line = sys._getframe().f_lineno + 1
    Logger.log_info("info msg")
    Logger.log_warn("warn msg")
    Logger.log_error("error msg")
    Logger.log_verbose("verbose msg")
    Logger.log("kw msg", Logger.WARNING)
    Logger.log(message="kw2", level=Logger.ERROR)
    records = [r for r in caplog.records if r.name == "triton.model"]
    assert [(r.getMessage(), r.levelno) for r in records] == [
        ("info msg", logging.INFO),
        ("warn msg", logging.WARNING),
        ("error msg", logging.ERROR),
        ("verbose msg", logging.DEBUG),
        ("kw msg", logging.WARNING),
        ("kw2", logging.ERROR),
    ]
    assert records[0].filename == "test_pb_utils_errors_logger.py"
    assert records[0].lineno == line
    assert records[1].lineno == line + 1
    assert records[0].funcName == "test_records_carry_the_calling_file_and_line"


def test_verbose_is_filtered_like_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="triton.model")
    Logger.log_verbose("hidden")
    Logger.log_info("shown")
    assert [r.getMessage() for r in caplog.records if r.name == "triton.model"] == ["shown"]


@pytest.mark.parametrize(
    ("call", "args", "invoked"),
    [
        ("log", ("m", 1), "'m', 1"),
        ("log", ("m", None), "'m', None"),
        ("log", (1,), "1"),
    ],
)
def test_log_type_errors(call: str, args: tuple, invoked: str) -> None:
    # [V] exact texts.
    with pytest.raises(TypeError) as info:
        getattr(Logger, call)(*args)
    assert str(info.value) == (
        "log(): incompatible function arguments. The following argument types are supported:\n"
        "    1. (message: str, level: c_python_backend_utils.Logger.LogLevel = "
        f"<LogLevel.INFO: 0>) -> None\n\nInvoked with: {invoked}"
    )


@pytest.mark.parametrize("call", ["log_info", "log_warn", "log_error", "log_verbose"])
def test_one_argument_type_errors(call: str) -> None:
    # [V] for log_info(5).
    with pytest.raises(TypeError) as info:
        getattr(Logger, call)(5)
    assert str(info.value) == (
        f"{call}(): incompatible function arguments. The following argument types are "
        "supported:\n    1. (message: str) -> None\n\nInvoked with: 5"
    )
