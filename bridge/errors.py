"""Triton error codes → the Dynamo exceptions that carry them to the client.

A Dynamo worker cannot choose the gRPC status of a unary error: the KServe frontend answers
INTERNAL for every exception, with `<Category>: <message>` inside the text (spec dynamo_runtime §2).
So the exception type is picked for the category it prints: `InvalidRequest:` for INVALID_ARG,
`NotFound:` for NOT_FOUND, `Cancelled:` for CANCELLED, `NotImplemented:` for UNSUPPORTED and
`Internal:` for the rest. Triton's message text is kept whole.

Never raise EngineShutdown, StreamIncomplete or WorkerUnavailable for a per-request error: they
take the whole worker out of routing for seconds.
"""

from __future__ import annotations

from dynamo.llm import HttpError
from dynamo.llm.exceptions import Cancelled, InvalidArgument, Unknown

from model_repository_loader.pb_utils import TritonError


def to_dynamo_exception(error: TritonError) -> Exception:
    code = error.code()
    message = error.message()
    if code == TritonError.INVALID_ARG:
        return InvalidArgument(message)
    if code == TritonError.NOT_FOUND:
        return HttpError(404, message)
    if code == TritonError.CANCELLED:
        return Cancelled(message)
    if code == TritonError.UNSUPPORTED:
        return HttpError(501, message)
    return Unknown(message)
