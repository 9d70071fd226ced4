"""`IsolatedInstance`: a model instance in its own process, restarted if it dies.

Seen from the scheduler it is an instance like the in-process kind: `submit(fn)` runs `fn` on a
dispatch thread of its own, and `run_batch(batch, decoupled)` sends the batch to the process and
returns when the model's `execute` returned (decoupled responses may keep coming after that).
A reader thread turns the process's messages into `Pending.deliver` calls.

If the process dies, only the requests it held fail, with Triton's text ("Stub process '<name>'
is not healthy."), and a new process is started and initialized. Batches dispatched meanwhile
wait for it (bounded by `RESTART_WAIT_S`). `on_health_change(alive)` tells the owner, so a
model whose instances are all down reports not ready.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from .. import pb_utils
from ..errors import ModelLoadError
from ..execution import Pending
from ..instance import InstanceSpec
from .messages import (
    Channel,
    WireRequest,
    pack_request,
    pack_response,
    unpack_request,
    unpack_response,
)
from .tensors import SegmentFolder

log = logging.getLogger(__name__)

RESTART_WAIT_S = 30.0
FINALIZE_WAIT_S = 30.0


class IsolatedInstance:
    """One instance of a model, run by a child Python process."""

    def __init__(
        self, spec: InstanceSpec, on_health_change: Callable[[bool], None] | None = None
    ) -> None:
        self.spec = spec
        self.name = spec.instance_name
        self.on_health_change = on_health_change
        self.restarts = 0
        self._folder = SegmentFolder.create(f"{spec.model_name}-{spec.instance_name}")
        self._keys = itertools.count(1)
        self._open: dict[int, Pending] = {}
        self._executing: dict[int, threading.Event] = {}
        self._lock = threading.Lock()
        self._alive = threading.Event()
        self._stopping = False
        self._process: subprocess.Popen[bytes] | None = None
        self._channel: Channel | None = None
        self._replies: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._bls = _BlsCalls(self)
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._dispatcher = threading.Thread(
            target=self._dispatch, name=f"isolated:{self.name}", daemon=True
        )
        self._dispatcher.start()

    @property
    def alive(self) -> bool:
        return self._alive.is_set()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    # -- lifecycle -------------------------------------------------------------------------

    def load(self) -> None:
        """Start the process and run `initialize` in it; ModelLoadError with Triton's reason."""
        reply = self._start_process()
        if reply[0] != "loaded":
            self._reap()
            raise ModelLoadError(reply[1] if reply[0] == "load_failed" else _died(self.name))
        self._set_alive(True)

    def _start_process(self) -> tuple[Any, ...]:
        parent_end, child_end = socket.socketpair()
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "model_repository_loader.isolation.child",
                str(child_end.fileno()),
                str(self._folder.path),
            ],
            pass_fds=[child_end.fileno()],
            env=_child_environment(),
        )
        child_end.close()
        self._channel = Channel(Connection(parent_end.detach()))
        self._replies = queue.SimpleQueue()
        threading.Thread(
            target=self._read, args=(self._channel,), name=f"isolated-read:{self.name}", daemon=True
        ).start()
        self._channel.send(("load", self.spec, logging.getLogger().getEffectiveLevel()))
        return self._replies.get()

    def finalize(self) -> None:
        """Run `finalize()` in the process, let it exit, and stop."""
        self._stopping = True
        channel = self._channel
        if channel is not None and self.alive:
            try:
                channel.send(("finalize",))
                self._replies.get(timeout=FINALIZE_WAIT_S)
            except (OSError, queue.Empty):
                log.warning("%s: finalize did not complete", self.name)
        self.stop()

    def stop(self) -> None:
        """End the process (if still running) and the dispatch thread."""
        self._stopping = True
        self._reap()
        self._calls.put(None)
        self._dispatcher.join(timeout=30)
        self._folder.remove()

    def _reap(self) -> None:
        process = self._process
        if process is None:
            return
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if self._channel is not None:
            self._channel.close()

    # -- running batches -------------------------------------------------------------------

    def submit(self, fn: Callable[[], None]) -> None:
        self._calls.put(fn)

    def _dispatch(self) -> None:
        while (fn := self._calls.get()) is not None:
            fn()

    def run_batch(self, batch: list[Pending], decoupled: bool) -> None:
        """Send one batch to the process; return once its `execute` returned."""
        if not self._alive.wait(RESTART_WAIT_S) or self._channel is None:
            for pending in batch:
                pending.fail(_died(self.name))
            return
        batch_id = next(self._keys)
        executed = threading.Event()
        wires = []
        with self._lock:
            self._executing[batch_id] = executed
            for pending in batch:
                key = next(self._keys)
                self._open[key] = pending
                wires.append(pack_request(self._folder, key, pending.request))
                pending.on_cancel(lambda key=key: self._send_cancel(key))
        try:
            self._channel.send(("execute", batch_id, wires, decoupled))
        except OSError:
            pass  # the reader sees the death and fails the batch
        executed.wait()

    def _send_cancel(self, key: int) -> None:
        channel = self._channel
        if channel is not None and key in self._open:
            try:
                channel.send(("cancel", key))
            except OSError:
                pass

    # -- messages from the process ---------------------------------------------------------

    def _read(self, channel: Channel) -> None:
        try:
            while True:
                message = channel.recv()
                kind = message[0]
                if kind == "respond":
                    self._respond(message[1], message[2], message[3])
                elif kind == "executed":
                    with self._lock:
                        event = self._executing.pop(message[1], None)
                    if event is not None:
                        event.set()
                elif kind == "log":
                    _emit_log(message[1])
                elif kind == "bls":
                    self._bls.start(message[1], message[2], message[3])
                elif kind == "bls_cancel":
                    self._bls.cancel(message[1])
                else:
                    self._replies.put(message)
        except (EOFError, OSError):
            pass
        self._on_exit()

    def _respond(self, key: int, wire: Any, final: bool) -> None:
        with self._lock:
            pending = self._open.pop(key, None) if final else self._open.get(key)
        if pending is not None:
            pending.deliver(unpack_response(self._folder, wire), final)

    def _on_exit(self) -> None:
        """The process is gone: fail what it held, then restart it unless we are stopping."""
        was_alive = self._alive.is_set()
        self._alive.clear()
        self._replies.put(("exited",))
        with self._lock:
            lost, self._open = list(self._open.values()), {}
            executing, self._executing = list(self._executing.values()), {}
        message = _died(self.name)
        for pending in lost:
            pending.fail(message)
        for event in executing:
            event.set()
        if self._stopping or not was_alive:
            return
        code = self._process.poll() if self._process is not None else None
        log.error("%s: instance process exited (code %s); restarting it", self.name, code)
        if self.on_health_change is not None:
            self.on_health_change(False)
        threading.Thread(target=self._restart, name=f"restart:{self.name}", daemon=True).start()

    def _restart(self) -> None:
        self._reap()
        self._folder.remove()
        self._folder = SegmentFolder.create(f"{self.spec.model_name}-{self.name}")
        if self._stopping:
            return
        reply = self._start_process()
        if reply[0] != "loaded":
            log.error("%s: restart failed: %s", self.name, reply[1:] or "process exited")
            return
        self.restarts += 1
        log.info("%s: instance process restarted (pid %s)", self.name, self.pid)
        self._set_alive(True)

    def _set_alive(self, alive: bool) -> None:
        if alive:
            self._alive.set()
        else:
            self._alive.clear()
        if self.on_health_change is not None:
            self.on_health_change(alive)

    def kill(self) -> None:
        """SIGKILL the process (tests use this to check the restart)."""
        if self._process is not None and self._process.poll() is None:
            os.kill(self._process.pid, 9)


class _BlsCalls:
    """BLS calls made by the model in the process, run here where the called models live."""

    def __init__(self, instance: IsolatedInstance) -> None:
        self.instance = instance
        self._running: dict[int, Any] = {}

    def start(self, call: int, wire: WireRequest, decoupled: bool) -> None:
        # A call blocks until its target answers: never on the reader thread.
        threading.Thread(
            target=self._run, args=(call, wire, decoupled), name="isolated-bls", daemon=True
        ).start()

    def _run(self, call: int, wire: WireRequest, decoupled: bool) -> None:
        instance = self.instance
        folder = instance._folder
        executor = pb_utils.request._bls_executor
        if executor is None:
            error = pb_utils.TritonError("BLS is not available: no model repository is loaded")
            self._send(call, pb_utils.InferenceResponse(error=error), True)
            return
        request = unpack_request(folder, wire, response_sender=None)
        result = executor(request, decoupled)
        if not decoupled:
            self._send(call, result, True)
            return
        self._running[call] = result
        # Hold each response back by one, so the last one goes out flagged final (the
        # iterator already ends with Triton's empty response where there is one).
        last: pb_utils.InferenceResponse | None = None
        try:
            for response in result:
                if last is not None:
                    self._send(call, last, False)
                last = response
        finally:
            self._running.pop(call, None)
            self._send(call, last, True)

    def cancel(self, call: int) -> None:
        iterator = self._running.get(call)
        if iterator is not None:
            iterator.cancel()

    def _send(self, call: int, response: pb_utils.InferenceResponse | None, final: bool) -> None:
        channel = self.instance._channel
        if channel is None:
            return
        try:
            channel.send(
                ("bls_respond", call, pack_response(self.instance._folder, response), final)
            )
        except OSError:
            pass  # the process is gone; so is the caller


def _child_environment() -> dict[str, str]:
    # The child imports this package by name: make sure it finds the same copy we run.
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    return env


def _died(name: str) -> str:
    return f"Stub process '{name}' is not healthy."


def _emit_log(attributes: dict[str, Any]) -> None:
    record = logging.makeLogRecord(attributes)
    logging.getLogger(record.name).handle(record)
