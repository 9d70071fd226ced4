"""The instance process: one `TritonPythonModel` in its own interpreter, like Triton's stub.

Started by `IsolatedInstance` as `python -m model_repository_loader.isolation.child FD FOLDER`.
It runs the same in-process machinery the thread kind uses (ModelInstance, run_execute, the
response sender), so a model behaves the same in both kinds; only the requests' way in and the
responses' way out are messages to the parent. The main thread reads messages, so a cancel
arrives while `execute` runs on the instance thread. Log records go to the parent, which prints
them with the server's own format.
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
    pack_request,
    pack_response,
    unpack_request,
    unpack_response,
)
from .tensors import SegmentFolder


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
            kind = message[0]
            if kind == "execute":
                self._execute(message[1], message[2], message[3])
            elif kind == "cancel":
                pending = self.open.get(message[1])
                if pending is not None:
                    pending.cancel()
            elif kind == "bls_respond":
                self.bls.answer(message[1], unpack_response(self.folder, message[2]), message[3])
            elif kind == "finalize":
                self.instance.finalize()
                self.channel.send(("finalized",))
                return

    def _execute(self, batch_id: int, requests: list[WireRequest], decoupled: bool) -> None:
        batch = [self._pending(wire, decoupled) for wire in requests]
        instance = self.instance
        assert instance is not None

        def run() -> None:
            run_execute(instance, batch, decoupled)
            self.channel.send(("executed", batch_id))

        instance.submit(run)

    def _pending(self, wire: WireRequest, decoupled: bool) -> Pending:
        key = wire.key

        def respond(response: pb_utils.InferenceResponse | None, final: bool) -> None:
            if final:
                self.open.pop(key, None)
            self.channel.send(("respond", key, pack_response(self.folder, response), final))

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
        self.channel.send(("bls", call, pack_request(self.folder, call, request), decoupled))
        if decoupled:
            return iterator
        return next(iterator)

    def answer(self, call: int, response: pb_utils.InferenceResponse | None, final: bool) -> None:
        with self._lock:
            iterator = self._calls.pop(call, None) if final else self._calls.get(call)
        if iterator is not None:
            iterator._put(response, final)


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
