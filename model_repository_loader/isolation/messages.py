"""What the parent and an instance process say to each other, over one socket pair.

Every message is one of the frozen dataclasses below; a receiver dispatches on its type with
`match`. Sends are serialized by a lock because the child answers from several threads (a
decoupled model sends from any thread it likes).

Parent → child                              Child → parent
                                              Started  (first, as soon as it runs)
  Load(spec, log_level)                       Loaded | LoadFailed(reason)
  Execute(batch_id, requests, decoupled)      Respond(key, response, final, failure)
                                                (failure: a failed request's reason, or None)
  Cancel(key)                                 Executed(batch_id)
  Finalize                                    Finalized
  SetLogLevel(level)  (the server's log level changed at run time)
                                              Log(attributes)
BLS calls and custom-metric operations the model makes go the other way round, since the models
it calls and the metrics registry live in the parent:
  BlsRespond(call, response, final)           Bls(call, request, decoupled) | BlsCancel(call)
  MetricReply(call, error, value)             Metric(call, op, args)  (call 0: no reply)
`Exited` is never sent: the parent's reader queues it for whoever waits on a reply from a
process that died.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from ..instance import InstanceSpec
from ..pb_utils import InferenceRequest, InferenceResponse, TritonError
from ..pb_utils.errors import ErrorCode
from .tensors import SegmentFolder, WireTensor, pack_all, unpack_all


@dataclass(frozen=True, slots=True)
class WireRequest:
    key: int
    request_id: str
    correlation_id: int | str
    flags: int
    timeout: int
    parameters_json: str
    requested_output_names: tuple[str, ...]
    inputs: list[WireTensor]
    # BLS requests only: the model called and its version (-1: the newest).
    model_name: str = ""
    model_version: int = -1


@dataclass(frozen=True, slots=True)
class WireResponse:
    outputs: list[WireTensor]
    error: tuple[str, ErrorCode] | None  # message, code
    parameters_json: str


# -- parent → child ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Load:
    spec: InstanceSpec
    log_level: int


@dataclass(frozen=True, slots=True)
class Execute:
    batch_id: int
    requests: list[WireRequest]
    decoupled: bool


@dataclass(frozen=True, slots=True)
class Cancel:
    key: int


@dataclass(frozen=True, slots=True)
class Finalize:
    pass


@dataclass(frozen=True, slots=True)
class IsReady:
    """Call the model's `is_ready()` beside `execute`; answered by ReadyAnswer."""

    check: int


@dataclass(frozen=True, slots=True)
class SetLogLevel:
    level: int


@dataclass(frozen=True, slots=True)
class BlsRespond:
    call: int
    response: WireResponse | None
    final: bool


@dataclass(frozen=True, slots=True)
class MetricReply:
    call: int
    error: str | None
    value: Any


# -- child → parent ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Started:
    pass


@dataclass(frozen=True, slots=True)
class Loaded:
    has_is_ready: bool = False  # the model defines `is_ready` (asked only then)


@dataclass(frozen=True, slots=True)
class LoadFailed:
    reason: str


@dataclass(frozen=True, slots=True)
class Respond:
    key: int
    response: WireResponse | None
    final: bool
    failure: str | None  # the request's failure reason, on a final response of a failed one


@dataclass(frozen=True, slots=True)
class ReadyAnswer:
    check: int
    reason: str | None  # None: ready (readiness.py)


@dataclass(frozen=True, slots=True)
class Executed:
    batch_id: int


@dataclass(frozen=True, slots=True)
class Finalized:
    pass


@dataclass(frozen=True, slots=True)
class Log:
    attributes: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Bls:
    call: int
    request: WireRequest
    decoupled: bool


@dataclass(frozen=True, slots=True)
class BlsCancel:
    call: int


@dataclass(frozen=True, slots=True)
class Metric:
    call: int  # 0: a release, not answered
    op: str
    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Exited:
    """Not a message: what the parent's reader queues when the process's stream ended."""


ToChild = Load | Execute | Cancel | Finalize | SetLogLevel | BlsRespond | MetricReply | IsReady
ToParent = (
    Started
    | Loaded
    | LoadFailed
    | Respond
    | Executed
    | Finalized
    | Log
    | Bls
    | BlsCancel
    | Metric
    | ReadyAnswer
)
# What a start or a finalize waits for (IsolatedInstance's reply queue).
Reply = Started | Loaded | LoadFailed | Finalized | Exited


class Channel:
    """A `Connection` that many threads may send on."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._send_lock = threading.Lock()

    def send(self, message: ToChild | ToParent) -> None:
        with self._send_lock:
            self.connection.send(message)

    def recv(self) -> Any:  # ToChild or ToParent, by side
        return self.connection.recv()

    def close(self) -> None:
        self.connection.close()


def pack_request(folder: SegmentFolder, key: int, request: InferenceRequest) -> WireRequest:
    return WireRequest(
        key,
        request.request_id(),
        request.correlation_id(),
        request.flags(),
        request.timeout(),
        request.parameters(),
        tuple(request.requested_output_names()),
        pack_all(folder, request.inputs()),
        request._model_name,
        request._model_version,
    )


def unpack_request(folder: SegmentFolder, wire: WireRequest, **incoming: Any) -> InferenceRequest:
    """The request `wire` describes; `incoming` adds `_incoming`'s sender and cancel check."""
    return InferenceRequest._incoming(
        inputs=unpack_all(folder, wire.inputs),
        request_id=wire.request_id,
        correlation_id=wire.correlation_id,
        flags=wire.flags,
        timeout=wire.timeout,
        parameters_json=wire.parameters_json,
        requested_output_names=set(wire.requested_output_names),
        model_name=wire.model_name,
        model_version=wire.model_version,
        **incoming,
    )


def pack_response(folder: SegmentFolder, response: InferenceResponse | None) -> WireResponse | None:
    if response is None:
        return None
    error = response.error()
    return WireResponse(
        pack_all(folder, response.output_tensors()),
        (error.message(), error.code()) if error is not None else None,
        response.parameters(),
    )


def unpack_response(folder: SegmentFolder, wire: WireResponse | None) -> InferenceResponse | None:
    if wire is None:
        return None
    error = None
    if wire.error is not None:
        error = TritonError(wire.error[0], wire.error[1])
    return InferenceResponse._create(unpack_all(folder, wire.outputs), error, wire.parameters_json)
