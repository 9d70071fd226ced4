"""The instance process: one `TritonPythonModel` in its own interpreter, like Triton's stub.

Started by `IsolatedInstance` as `python -m model_repository_loader.isolation.child FD FOLDER`.
It runs the same in-process machinery the thread kind uses (ModelInstance, run_execute, the
response sender), so a model behaves the same in both kinds; only the requests' way in and the
responses' way out are messages to the parent. The main thread reads messages, so a cancel
arrives while `execute` runs on the instance thread. Log records go to the parent, which prints
them with the server's own format.

The process says "started" as soon as it runs (the parent bounds that, then `initialize`). A
failure while handling a message (a shared-memory read or write, a send) fails that request or
BLS call with an INTERNAL text, and the batch is always reported "executed", so the parent never
waits for an answer that cannot come.
"""

from __future__ import annotations

import itertools
import logging
import signal
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from .. import pb_utils
from ..errors import ModelLoadError
from ..execution import Pending, run_execute
from ..instance import ModelInstance
from .messages import (
    Channel,
    WireRequest,
    WireResponse,
    pack_request,
    pack_response,
    unpack_request,
    unpack_response,
)
from .tensors import SegmentFolder

log = logging.getLogger(__name__)


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
            self._channel.send(("log", attributes))
        except OSError:
            pass  # the parent is gone; nobody to tell


class InstanceProcess:
    def __init__(self, channel: Channel, folder: SegmentFolder) -> None:
        self.channel = channel
        self.folder = folder
        self.instance: ModelInstance | None = None
        self.open: dict[int, Pending] = {}
        self.bls = ForwardedBls(channel, folder)
        pb_utils.set_bls_executor(self.bls)

    def serve(self) -> None:
        self.channel.send(("started",))
        _, spec, log_level = self.channel.recv()
        logging.getLogger().setLevel(log_level)
        self.instance = ModelInstance(spec)
        try:
            self.instance.load()
        except ModelLoadError as exc:
            self.channel.send(("load_failed", str(exc)))
            return
        self.channel.send(("loaded",))
        while True:
            try:
                message = self.channel.recv()
            except (EOFError, OSError):
                return  # the parent died: so do we, as Triton's stub does
            try:
                if not self._handle(message):
                    return
            except Exception:  # one message's failure must not end the process
                log.exception("handling a %r message failed", message[0])

    def _handle(self, message: tuple[Any, ...]) -> bool:
        """Act on one message from the parent; False once the process should end."""
        kind = message[0]
        if kind == "execute":
            self._execute(message[1], message[2], message[3])
        elif kind == "cancel":
            pending = self.open.get(message[1])
            if pending is not None:
                pending.cancel()
        elif kind == "bls_respond":
            self._bls_respond(message[1], message[2], message[3])
        elif kind == "finalize":
            assert self.instance is not None
            self.instance.finalize()
            self.channel.send(("finalized",))
            return False
        return True

    def _bls_respond(self, call: int, wire: WireResponse | None, final: bool) -> None:
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
                self._send(("respond", wire.key, pack_response(self.folder, _error(message)), True))

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
                self._send(("executed", batch_id))

        instance.submit(run)

    def _send(self, message: tuple[Any, ...]) -> None:
        try:
            self.channel.send(message)
        except OSError:
            pass  # the parent is gone; this process ends when its main thread sees it

    def _pending(self, wire: WireRequest, decoupled: bool) -> Pending:
        key = wire.key

        def respond(response: pb_utils.InferenceResponse | None, final: bool) -> None:
            try:
                packed = pack_response(self.folder, response)
            except Exception as exc:
                # The request still gets an answer; whatever the model sends later is dropped.
                instance = self.instance
                assert instance is not None
                message = _failure(instance, f"could not pass the response out: {exc!r}")
                log.error("%s", message)
                packed, final = pack_response(self.folder, _error(message)), True
            if final:
                self.open.pop(key, None)
            self._send(("respond", key, packed, final))

        def build(pending: Pending) -> pb_utils.InferenceRequest:
            sender = pb_utils.InferenceResponseSender(
                pending.deliver, decoupled=decoupled, is_cancelled=pending.is_cancelled
            )
            return unpack_request(
                self.folder, wire, response_sender=sender, is_cancelled=pending.is_cancelled
            )

        pending = Pending(build, respond, _unchanged)
        self.open[key] = pending
        return pending


class ForwardedBls:
    """The child's BLS executor: the called models live in the parent, so ask it.

    Each call gets a ResponseIterator that the main thread fills from the parent's
    `bls_respond` messages; `exec()` (not decoupled) waits for its one response.
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
        iterator = pb_utils.ResponseIterator._create(
            lambda: self.channel.send(("bls_cancel", call))
        )
        with self._lock:
            self._calls[call] = iterator
        wire = None
        try:
            wire = pack_request(self.folder, call, request)
            self.channel.send(("bls", call, wire, decoupled))
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


def _error(message: str) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse(
        error=pb_utils.TritonError(message, pb_utils.TritonError.INTERNAL)
    )


def _failure(instance: ModelInstance, what: str) -> str:
    return f"Failed to process the request(s) for model '{instance.name}', message: {what}"


def _unchanged(response: Any) -> Any:
    # The parent filters outputs and applies reshapes; the child sends what the model made.
    return response


def main(argv: list[str]) -> int:
    # Ctrl-C in a terminal reaches the whole process group; the parent decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    channel = Channel(Connection(int(argv[1])))
    logging.getLogger().handlers[:] = [_ForwardLogs(channel)]
    pb_utils.install()
    InstanceProcess(channel, SegmentFolder(Path(argv[2]))).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
