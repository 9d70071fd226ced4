"""The instance process: one `TritonPythonModel` in its own interpreter, like Triton's stub.

Started by `IsolatedInstance` as `python -m model_repository_loader.isolation.child FD FOLDER`.
It runs the same in-process machinery the thread kind uses (ModelInstance, run_execute, the
response sender), so a model behaves the same in both kinds; only the requests' way in and the
responses' way out are messages to the parent. The main thread only reads messages, from the
"load" on, while `initialize`, `execute` and `finalize` run on the instance thread: so a cancel
arrives while `execute` runs, and the parent's reply to a call the model makes (a custom metric
operation, ForwardedMetrics) arrives whichever thread of the model waits for it. Log records go
to the parent, which prints them with the server's own format. A request's final response says
whether the request failed, and why (Triton's failure reason), for the parent's statistics.
`sys.argv` is `[""]`, what a model sees under Triton's stub.

The process says Started as soon as it runs (the parent bounds that, then `initialize`). A
failure while handling a message (a shared-memory read or write, a send) fails that request or
BLS call with an INTERNAL text, and the batch is always reported "executed", so the parent never
waits for an answer that cannot come.
"""

from __future__ import annotations

import collections
import itertools
import logging
import queue
import signal
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from .. import pb_utils
from ..errors import ModelLoadError, failed_requests_text
from ..execution import Pending, run_execute
from ..instance import ModelInstance
from ..pb_utils.metrics import forward_to
from .messages import (
    Bls,
    BlsCancel,
    BlsRespond,
    Cancel,
    Channel,
    Execute,
    Executed,
    Finalize,
    Finalized,
    IsReady,
    Load,
    Loaded,
    LoadFailed,
    Log,
    Metric,
    MetricReply,
    ReadyAnswer,
    Respond,
    SetLogLevel,
    Started,
    ToChild,
    ToParent,
    WireRequest,
    pack_request,
    pack_response,
    unpack_request,
    unpack_response,
)
from .tensors import SegmentFolder

log = logging.getLogger(__name__)

# The failure reason (bridge/metrics/triton.py) of a request this process could not serve.
FAILED = "BACKEND"
_PARENT_GONE = "the server process is gone"


class _ForwardLogs(logging.Handler):
    def __init__(self, channel: Channel) -> None:
        super().__init__(logging.DEBUG)
        self._channel = channel

    def emit(self, record: logging.LogRecord) -> None:
        attributes = dict(record.__dict__)
        attributes["msg"] = record.getMessage()
        attributes["args"] = None
        if record.exc_info:
            attributes["exc_text"] = logging.Formatter().formatException(record.exc_info)
        attributes["exc_info"] = None
        try:
            self._channel.send(Log(attributes))
        except OSError:
            pass  # the parent is gone; nobody to tell


class InstanceProcess:
    def __init__(self, channel: Channel, folder: SegmentFolder) -> None:
        self.channel = channel
        self.folder = folder
        self.instance: ModelInstance | None = None
        self.open: dict[int, Pending] = {}
        self.bls = ForwardedBls(channel, folder)
        # The process's one instance reaches the server's models through its parent.
        self.services = pb_utils.ModelServices(bls=self.bls)
        self.metrics = ForwardedMetrics(channel)
        forward_to(self.metrics)

    def serve(self) -> None:
        """Run until the parent closes the channel (after Finalized, or if it died)."""
        self.channel.send(Started())
        load: Load = self.channel.recv()
        logging.getLogger().setLevel(load.log_level)
        instance = self.instance = ModelInstance(load.spec, self.services)
        _in_background("load", lambda: self._send(_loaded(instance)))
        while True:
            try:
                message = self.channel.recv()
            except (EOFError, OSError):
                break  # the parent is done with us, or died: we end, as Triton's stub does
            try:
                self._handle(message)
            except Exception:  # one message's failure must not end the process
                log.exception("handling %r failed", type(message).__name__)
        self.metrics.close()

    def _handle(self, message: ToChild) -> None:
        """Act on one message from the parent; never waits for the model."""
        match message:
            case Execute(batch_id, requests, decoupled):
                self._execute(batch_id, requests, decoupled)
            case Cancel(key):
                pending = self.open.get(key)
                if pending is not None:
                    pending.cancel()
            case BlsRespond():
                self._bls_respond(message)
            case MetricReply(call, error, value):
                self.metrics.answer(call, error, value)
            case SetLogLevel(level):
                logging.getLogger().setLevel(level)
            case IsReady(check):
                self._is_ready(check)
            case Finalize():
                instance = self.instance
                assert instance is not None

                def finalize() -> None:
                    try:
                        instance.finalize()
                    finally:  # the parent waits for it (bounded), whatever happened
                        self._send(Finalized())

                _in_background("finalize", finalize)
            case _:
                log.error("unexpected message %r from the server process", message)

    def _is_ready(self, check: int) -> None:
        """Answer on a thread of its own: the stub calls `is_ready()` beside `execute`."""
        instance = self.instance
        assert instance is not None

        def answer() -> None:
            try:
                reason = instance.run_is_ready()
            except BaseException as exc:  # the parent's check waits for an answer, always
                reason = f"{type(exc).__name__}: {exc}"
            self._send(ReadyAnswer(check, reason))

        _in_background("is_ready", answer)

    def _bls_respond(self, reply: BlsRespond) -> None:
        call, wire, final = reply.call, reply.response, reply.final
        try:
            response = unpack_response(self.folder, wire)
        except Exception as exc:
            if wire is not None:
                self.folder.discard(wire.outputs)
            message = f"BLS call failed: could not read its response: {exc!r}"
            log.error("%s", message)
            response, final = _error(message), True
        self.bls.answer(call, response, final)

    def _execute(self, batch_id: int, requests: list[WireRequest], decoupled: bool) -> None:
        instance = self.instance
        assert instance is not None
        batch = []
        for wire in requests:
            try:
                batch.append(self._pending(wire, decoupled))
            except Exception as exc:
                self.folder.discard(wire.inputs)
                message = _failure(instance, f"could not read the request: {exc!r}")
                log.error("%s", message)
                packed = pack_response(self.folder, _error(message))
                self._send(Respond(wire.key, packed, True, FAILED))

        def run() -> None:
            try:
                if batch:
                    run_execute(instance, batch, decoupled)
            except Exception as exc:
                message = _failure(instance, repr(exc))
                log.error("%s", message)
                for pending in batch:
                    try:
                        pending.fail(message)
                    except Exception:
                        pass  # the send itself is what fails; the parent hears of the death
            finally:
                # Always: the parent's dispatcher waits for it.
                self._send(Executed(batch_id))

        instance.post(run)

    def _send(self, message: ToParent) -> None:
        try:
            self.channel.send(message)
        except OSError:
            pass  # the parent is gone; this process ends when its main thread sees it

    def _pending(self, wire: WireRequest, decoupled: bool) -> Pending:
        key = wire.key
        outcome = _Outcome()

        def respond(response: pb_utils.InferenceResponse | None, final: bool) -> None:
            failure = outcome.failure
            try:
                packed = pack_response(self.folder, response)
            except Exception as exc:
                # The request still gets an answer; whatever the model sends later is dropped.
                instance = self.instance
                assert instance is not None
                message = _failure(instance, f"could not pass the response out: {exc!r}")
                log.error("%s", message)
                packed, final, failure = pack_response(self.folder, _error(message)), True, FAILED
            if final:
                self.open.pop(key, None)
            self._send(Respond(key, packed, final, failure if final else None))

        request = unpack_request(self.folder, wire, response_sender=None)
        # No shape: the parent filters outputs and applies reshapes; this sends what the model made.
        pending = Pending(request, respond, decoupled=decoupled, stats=outcome)
        self.open[key] = pending
        return pending


class _Outcome:
    """A request's statistics here: only whether it failed, which its final response carries.

    The parent counts everything else; `Pending.deliver` records the outcome just before it
    responds, so `respond` reads it for the final response.
    """

    __slots__ = ("failure",)

    def __init__(self) -> None:
        self.failure: str | None = None

    def record_request(
        self, ok: bool, batch_size: int, duration_ns: int, reason: str = FAILED
    ) -> None:
        self.failure = None if ok else reason

    def queue_changed(self, delta: int) -> None:
        pass

    def record_first_response(self, duration_ns: int) -> None:
        pass


class ForwardedMetrics:
    """The child's MetricsLink: custom metrics live in the parent's registry, so ask it.

    A call waits for the parent's MetricReply, which the main thread hands over (so the main
    thread itself must never call; model code never runs there). Releases, made from `__del__`,
    only queue their message, and a thread of their own sends it; every call first sends the
    releases queued before it, so the parent sees them in the order the model made them.
    """

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # _waiting, _closed
        self._waiting: dict[int, _Reply] = {}
        self._closed = False
        self._order = threading.Lock()  # held while sending: releases, then the call
        self._releases: collections.deque[Metric] = collections.deque()
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        _in_background("metric-releases", self._send_releases)

    def call(self, op: str, *args: Any) -> Any:
        if threading.current_thread() is threading.main_thread():
            raise RuntimeError("the main thread of an instance process reads the replies")
        call = next(self._ids)
        reply = _Reply()
        with self._lock:
            closed = self._closed
            if not closed:
                self._waiting[call] = reply
        if closed:
            raise pb_utils.TritonModelException(_PARENT_GONE)
        try:
            with self._order:
                self._flush()
                self.channel.send(Metric(call, op, args))
        except OSError:
            with self._lock:
                self._waiting.pop(call, None)
            raise pb_utils.TritonModelException(_PARENT_GONE) from None
        reply.done.wait()
        if reply.error is not None:
            raise pb_utils.TritonModelException(reply.error)
        return reply.value

    def release(self, op: str, *args: Any) -> None:
        # From __del__, maybe in the middle of a send on this very thread: no lock, no send.
        self._releases.append(Metric(0, op, args))
        self._wake.put(None)

    def answer(self, call: int, error: str | None, value: Any) -> None:
        with self._lock:
            reply = self._waiting.pop(call, None)
        if reply is not None:
            reply.error, reply.value = error, value
            reply.done.set()

    def close(self) -> None:
        """The parent is gone: no call will be answered."""
        with self._lock:
            self._closed = True
            waiting, self._waiting = list(self._waiting.values()), {}
        for reply in waiting:
            reply.error = _PARENT_GONE
            reply.done.set()

    def _send_releases(self) -> None:
        while True:
            self._wake.get()
            try:
                with self._order:
                    self._flush()
            except OSError:
                return  # the parent is gone; nothing to release any more

    def _flush(self) -> None:
        while self._releases:
            self.channel.send(self._releases.popleft())


class _Reply:
    __slots__ = ("done", "error", "value")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: str | None = None
        self.value: Any = None


class ForwardedBls:
    """The child's BLS executor: the called models live in the parent, so ask it.

    Each call gets a ResponseIterator that the main thread fills from the parent's
    BlsRespond messages; `exec()` (not decoupled) waits for its one response.
    """

    def __init__(self, channel: Channel, folder: SegmentFolder) -> None:
        self.channel = channel
        self.folder = folder
        self._calls: dict[int, pb_utils.ResponseIterator] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def __call__(
        self, request: pb_utils.InferenceRequest, decoupled: bool
    ) -> pb_utils.InferenceResponse | pb_utils.ResponseIterator:
        call = next(self._ids)
        iterator = pb_utils.ResponseIterator._create(lambda: self.channel.send(BlsCancel(call)))
        with self._lock:
            self._calls[call] = iterator
        wire = None
        try:
            wire = pack_request(self.folder, call, request)
            self.channel.send(Bls(call, wire, decoupled))
        except Exception as exc:
            # The call is answered with the failure rather than left waiting.
            if wire is not None:
                self.folder.discard(wire.inputs)
            self.answer(call, _error(f"BLS call failed: could not send the request: {exc!r}"), True)
        if decoupled:
            return iterator
        return next(iterator)

    def answer(self, call: int, response: pb_utils.InferenceResponse | None, final: bool) -> None:
        with self._lock:
            iterator = self._calls.pop(call, None) if final else self._calls.get(call)
        if iterator is not None:
            iterator._put(response, final)


def _loaded(instance: ModelInstance) -> Loaded | LoadFailed:
    """Load the model: the message that tells the parent how it went."""
    try:
        instance.load()
    except ModelLoadError as exc:
        return LoadFailed(str(exc))
    except BaseException as exc:  # the parent must hear of it rather than wait for its bound
        return LoadFailed(f"Internal: {exc!r}")
    return Loaded(instance.has_is_ready)


def _in_background(name: str, target: Any) -> None:
    threading.Thread(target=target, name=name, daemon=True).start()


def _error(message: str) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse(
        error=pb_utils.TritonError(message, pb_utils.TritonError.INTERNAL)
    )


def _failure(instance: ModelInstance, what: str) -> str:
    return failed_requests_text(instance.name, what)


def main(argv: list[str]) -> int:
    # Ctrl-C in a terminal reaches the whole process group; the parent decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    channel = Channel(Connection(int(argv[1])))
    folder = SegmentFolder(Path(argv[2]))
    # Ours are parsed; a model that parses sys.argv (argparse, unittest.main) sees what Triton's
    # stub shows it [V on 2.51], not our command line.
    sys.argv[:] = [""]
    logging.getLogger().handlers[:] = [_ForwardLogs(channel)]
    pb_utils.install()
    InstanceProcess(channel, folder).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
