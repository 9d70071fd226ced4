"""Triton error codes → the Dynamo exceptions that carry them to the client, and the log line.

A Dynamo worker cannot choose the gRPC status of a unary error: the KServe frontend answers
INTERNAL for every exception, with `<Category>: <message>` inside the text (spec dynamo_runtime §2).
So the exception type is picked for the category it prints: `InvalidRequest:` for INVALID_ARG,
`NotFound:` for NOT_FOUND, `Cancelled:` for CANCELLED, `NotImplemented:` for UNSUPPORTED and
`Internal:` for the rest. Triton's message text is kept whole.

Every failed request is logged here, once, on one line: model, request id, code and message,
with the client's strings escaped and cut (bridge/logs.py). The exception classes are
subclasses named `Reported…` so that logs.StderrGuard can drop the traceback Dynamo prints for
each of them.

Never raise EngineShutdown, StreamIncomplete or WorkerUnavailable for a per-request error: they
take the whole worker out of routing for seconds.
"""

from __future__ import annotations

import logging

from dynamo.llm import HttpError
from dynamo.llm.exceptions import Cancelled, InvalidArgument, Unknown

from model_repository_loader.pb_utils import TritonError

from .logs import printable

log = logging.getLogger(__name__)

# Longest message kept in the log line; the client gets the whole text.
MESSAGE_LIMIT = 512


class ReportedInvalidArgument(InvalidArgument):
    """INVALID_ARG, already logged."""


class ReportedCancelled(Cancelled):
    """CANCELLED, already logged."""


class ReportedUnknown(Unknown):
    """Any other code, already logged."""


class ReportedHttpError(HttpError):
    """NOT_FOUND (404) or UNSUPPORTED (501), already logged."""


# The client's fault, or the client's choice: an INFO line, nothing for an operator to act on (a
# healthy server prints no WARN or ERROR line; Triton logs no failed request at all).
_CLIENT_CODES = frozenset(
    {TritonError.INVALID_ARG, TritonError.NOT_FOUND, TritonError.CANCELLED, TritonError.UNSUPPORTED}
)


def to_dynamo_exception(error: TritonError) -> Exception:
    code = error.code()
    message = error.message()
    if code == TritonError.INVALID_ARG:
        return ReportedInvalidArgument(message)
    if code == TritonError.NOT_FOUND:
        return ReportedHttpError(404, message)
    if code == TritonError.CANCELLED:
        return ReportedCancelled(message)
    if code == TritonError.UNSUPPORTED:
        return ReportedHttpError(501, message)
    return ReportedUnknown(message)


def request_failed(model: str, request_id: str, error: TritonError) -> Exception:
    """Log the one line of a failed request; return the exception that answers the client."""
    code = error.code()
    log.log(
        logging.INFO if code in _CLIENT_CODES else logging.ERROR,
        "request failed: model '%s', id '%s', %s: %s",
        printable(model),
        printable(request_id),
        code.name,
        printable(error.message(), MESSAGE_LIMIT),
    )
    return to_dynamo_exception(error)
