"""`IsolatedInstance`: a model instance in its own process, restarted if it dies.

Seen from the scheduler it is an instance like the in-process kind: `submit(fn)` runs `fn` on a
dispatch thread of its own, and `run_batch(batch, decoupled)` sends the batch to the process and
returns when the model's `execute` returned (decoupled responses may keep coming after that).
A reader thread turns the process's messages into `Pending.deliver` calls.

Nothing on the way stops an instance: a failure while passing a batch in (a shared-memory write,
a send) fails that batch's requests with an INTERNAL text, one that handling a message from the
process fails that request (or BLS call) only, and both threads go on serving.

Every wait is bounded. Starting is two steps, as Triton's stub start-up is: the process must say
Started (its interpreter and this package imported) within `start_timeout` (30 s, as Triton's
`stub-timeout-seconds`), then `initialize` must finish within `initialize_timeout`: generous
(10 min) because loading weights legitimately takes long, and set per model with the config
parameter `BRIDGE_INITIALIZE_TIMEOUT_SECONDS`. A start that fails or runs out of time kills the
process and leaves nothing behind (process, socket, shared-memory folder). `finalize(timeout)`
and `stop(timeout)` are bounded in total; at the bound the process is killed and reaped.

If the process dies, only the requests it held fail, with Triton's text ("Stub process '<name>'
is not healthy."), and a new process is started and initialized, retried with exponential backoff
(`restart_backoff`, doubling up to `restart_backoff_cap`) until it succeeds or the instance is
stopped. Batches dispatched meanwhile wait for it (bounded by `RESTART_WAIT_S`).
`on_health_change(alive)` tells the owner, so a model whose instances are all down reports not
ready, and ready again once one is back.

A cancel comes from the caller's thread (the server's event loop): it is only queued there, and
a thread of the instance (the replier) sends it, after the batch that holds the request was sent.

The model's custom metrics live here, in the server's registry (pb_utils/metrics.py): the reader
runs each operation the process asks for, with the instance bound, and the replier answers it
(the reader never sends: it must never wait on a process that waits for it). The families
belong to the process: they go when it ends (finalized, or dead; a restarted process makes its
own again in `initialize`). A final response carries the request's failure reason, if it failed.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from .. import pb_utils
from ..deadlines import remaining
from ..errors import ModelLoadError, failed_requests_text
from ..execution import Pending
from ..instance import InstanceSpec
from ..pb_utils.metrics import LinkedMetrics, registry_of
from ..readiness import ReadyCheck, Reason
from .bls_calls import BlsCalls
from .environments import ExecutionEnvironment
from .messages import (
    Bls,
    BlsCancel,
    Cancel,
    Channel,
    Execute,
    Executed,
    Exited,
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
    Reply,
    Respond,
    SetLogLevel,
    Started,
    ToChild,
    ToParent,
    WireRequest,
    pack_request,
    unpack_response,
)
from .tensors import SegmentFolder

log = logging.getLogger(__name__)

# A batch dispatched while the process restarts waits this long for it before it fails: about
# one start (START_TIMEOUT_S) — a process that is not back by then is not coming back soon.
RESTART_WAIT_S = 30.0
# finalize()/stop() given no bound (a load that failed half-way stops what it started; a close
# passes its own): as long as a start may take, so a process slow to come is as long to go.
FINALIZE_WAIT_S = 30.0
# Triton's `stub-timeout-seconds` default: the process must be up and talking by then.
START_TIMEOUT_S = 30.0
# `initialize` loads weights: bounded so a hung one cannot block a load forever, but generously.
INITIALIZE_TIMEOUT_S = 600.0
INITIALIZE_TIMEOUT_PARAMETER = "BRIDGE_INITIALIZE_TIMEOUT_SECONDS"
# Between restarts of a process that keeps dying: the first soon (a one-off crash is back at
# once), then doubling, so a model that crashes at every start costs one start per 30 s at most.
RESTART_BACKOFF_S = 0.5
RESTART_BACKOFF_CAP_S = 30.0
# After a kill, how long to wait for the reader to see the end of the stream (the kernel closes
# a killed process's socket at once; this only bounds a reader thread that is itself stuck).
_REAP_S = 5.0


@dataclass(eq=False)
class Child:
    """One instance process and what belongs to it; a restart makes a new one."""

    process: subprocess.Popen[bytes]
    channel: Channel
    folder: SegmentFolder
    replies: queue.SimpleQueue[Reply] = field(default_factory=queue.SimpleQueue)
    reader: threading.Thread | None = None
    # Requests and batches sent to this process (under IsolatedInstance._lock); `exited` once
    # its reader saw the end, after which nothing more is registered.
    open: dict[int, Pending] = field(default_factory=dict)
    executing: dict[int, threading.Event] = field(default_factory=dict)
    exited: bool = False
    reaped: bool = False
    # The custom metric families and metrics the model in this process holds (reader thread).
    metrics: LinkedMetrics = field(default_factory=LinkedMetrics)
    reap_lock: threading.Lock = field(default_factory=threading.Lock)
    # Its model defines `is_ready` (told by Loaded); the checks it has not answered yet.
    has_is_ready: bool = False
    ready_checks: dict[int, Future[Reason]] = field(default_factory=dict)


# Every instance of this process, so a log level change reaches their processes.
_INSTANCES: weakref.WeakSet[IsolatedInstance] = weakref.WeakSet()


def set_isolated_log_level(level: int) -> None:
    """The server's log level changed at run time: tell every instance process. A process
    started later gets the level with its Load."""
    for instance in list(_INSTANCES):
        child = instance._child
        if child is not None and not child.exited:
            instance._outgoing.put((child, SetLogLevel(level)))


class IsolatedInstance:
    """One instance of a model, run by a child Python process."""

    def __init__(
        self,
        spec: InstanceSpec,
        on_health_change: Callable[[bool], None] | None = None,
        *,
        start_timeout: float = START_TIMEOUT_S,
        initialize_timeout: float | None = None,
        restart_backoff: float = RESTART_BACKOFF_S,
        restart_backoff_cap: float = RESTART_BACKOFF_CAP_S,
        services: pb_utils.ModelServices | None = None,
        environment: ExecutionEnvironment | None = None,
    ) -> None:
        """`initialize_timeout` None: the model's config parameter, else INITIALIZE_TIMEOUT_S.

        `services`: what the model reaches through pb_utils (its repository's BLS executor and
        metrics registry), here in the server process, where the process's calls arrive.
        `environment`: the model's own Python environment (EXECUTION_ENV_PATH), whose
        interpreter runs the process; None: this interpreter.
        """
        self.spec = spec
        self.environment = environment
        self.services = services
        self.name = spec.instance_name
        self.on_health_change = on_health_change
        self.restarts = 0
        self.start_timeout = start_timeout
        self.initialize_timeout = initialize_timeout
        self.restart_backoff = restart_backoff
        self.restart_backoff_cap = restart_backoff_cap
        self._keys = itertools.count(1)
        self._lock = threading.Lock()  # each child's open, executing and exited
        # Guards the life-cycle state: the current child, alive, stopping.
        self._state = threading.Condition()
        self._child: Child | None = None
        self._alive = False
        self._stopping = False
        self._restarter: threading.Thread | None = None
        self._bls = BlsCalls(self.name, services)
        self._ready_check = ReadyCheck(self._start_is_ready)
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        # Cancels and metric replies, sent by the replier thread: (process, message).
        self._outgoing: queue.SimpleQueue[tuple[Child, ToChild] | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._dispatch, name=f"isolated:{self.name}", daemon=True),
            threading.Thread(target=self._reply, name=f"isolated-reply:{self.name}", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        _INSTANCES.add(self)

    @property
    def alive(self) -> bool:
        return self._alive

    @property
    def pid(self) -> int | None:
        child = self._child
        return child.process.pid if child is not None else None

    # -- lifecycle -------------------------------------------------------------------------

    def load(self) -> None:
        """Start the process and run `initialize` in it; ModelLoadError with Triton's reason.

        On failure (the model's, an OSError starting the process, a timeout) nothing of the
        attempt is left: the process is killed and reaped, its socket and folder are gone.
        """
        self._start()
        self._health_changed(True)

    def _start(self) -> None:
        """Start a process and initialize it; the instance is alive when this returns."""
        timeout = self._initialize_timeout()
        child = self._spawn()
        try:
            started = _next_reply(child, self.start_timeout)
            if started is None:
                raise ModelLoadError(
                    f"Internal: the process of instance '{self.name}' did not start within "
                    f"{self.start_timeout:g} s; it was stopped"
                )
            if not isinstance(started, Started):
                raise ModelLoadError(_died(self.name))
            reply = _next_reply(child, timeout)
            if reply is None:
                raise ModelLoadError(
                    f"Internal: initialize of instance '{self.name}' did not finish within "
                    f"{timeout:g} s (model config parameter {INITIALIZE_TIMEOUT_PARAMETER}); "
                    "its process was stopped"
                )
            if isinstance(reply, LoadFailed):
                raise ModelLoadError(reply.reason)
            if not isinstance(reply, Loaded):
                raise ModelLoadError(_died(self.name))
            child.has_is_ready = reply.has_is_ready
            with self._state:
                # Checked with the lock held: if the process died already, its reader saw it
                # before we get here (no restart for a never-alive child), so we must not live.
                if child.exited or self._stopping:
                    raise ModelLoadError(_died(self.name))
                self._alive = True
                self._state.notify_all()
        except BaseException:
            with self._state:
                if self._child is child:
                    self._child = None
            self._reap(child, 0.0)
            raise

    def _spawn(self) -> Child:
        """Start a process (not yet initialized) and its reader; ModelLoadError on OSError."""
        folder: SegmentFolder | None = None
        parent_end = child_end = None
        try:
            with self._state:
                # Under the lock: `stop` sees every process started, or none starts after it.
                if self._stopping:
                    raise ModelLoadError(f"Internal: instance '{self.name}' is being stopped")
                folder = SegmentFolder.create(f"{self.spec.model_name}-{self.name}")
                parent_end, child_end = socket.socketpair()
                environment = self.environment
                process = subprocess.Popen(
                    [
                        str(environment.python) if environment else sys.executable,
                        "-m",
                        "model_repository_loader.isolation.child",
                        str(child_end.fileno()),
                        str(folder.path),
                    ],
                    pass_fds=[child_end.fileno()],
                    env=_child_environment(environment),
                )
                channel = Channel(Connection(parent_end.detach()))
                child = Child(process, channel, folder)
                self._child = child
        except (OSError, subprocess.SubprocessError) as exc:
            if parent_end is not None:
                parent_end.close()
            if folder is not None:
                folder.remove()
            raise ModelLoadError(
                f"Internal: could not start the process of instance '{self.name}': {exc}"
            ) from None
        finally:
            if child_end is not None:
                child_end.close()
        child.reader = threading.Thread(
            target=self._read, args=(child,), name=f"isolated-read:{self.name}", daemon=True
        )
        child.reader.start()
        try:
            child.channel.send(Load(self.spec, logging.getLogger().getEffectiveLevel()))
        except OSError:
            pass  # the process died already: the reader says so
        return child

    def _initialize_timeout(self) -> float:
        if self.initialize_timeout is not None:
            return self.initialize_timeout
        try:
            parameters = json.loads(self.spec.args.get("model_config", "{}")).get("parameters")
        except ValueError:
            parameters = None
        text = ((parameters or {}).get(INITIALIZE_TIMEOUT_PARAMETER) or {}).get("string_value")
        if text is None:
            return INITIALIZE_TIMEOUT_S
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not value > 0:
            raise ModelLoadError(
                f"Invalid argument: parameter '{INITIALIZE_TIMEOUT_PARAMETER}' of model "
                f"'{self.spec.model_name}' is '{text}'; expected a positive number of seconds"
            )
        return value

    def finalize(self, timeout: float | None = FINALIZE_WAIT_S) -> bool:
        """Run `finalize()` in the process, let it exit, and stop.

        Bounded by `timeout` seconds in total (None: no bound); past it the process is killed.
        Returns False if finalize did not complete (or something had to be killed).
        """
        deadline = _deadline(timeout)
        with self._state:
            child = self._child if self._alive and not self._stopping else None
        finished = False
        if child is not None:
            try:
                child.channel.send(Finalize())
                finished = isinstance(_next_reply(child, remaining(deadline)), Finalized)
            except OSError:
                pass
            if not finished:
                log.warning(
                    "%s: finalize did not complete within %ss; stopping the instance process",
                    self.name,
                    timeout,
                )
        return self.stop(remaining(deadline)) and (finished or child is None)

    def stop(self, timeout: float | None = FINALIZE_WAIT_S) -> bool:
        """End the process (at once if not finalized) and the instance's threads.

        Bounded by `timeout` seconds (None: no bound); False if something had to be abandoned.
        """
        deadline = _deadline(timeout)
        with self._state:
            self._stopping = True
            self._alive = False
            child, self._child = self._child, None
            self._state.notify_all()
        clean = True
        if child is not None:
            clean = self._reap(child, remaining(deadline))
        self._calls.put(None)
        self._outgoing.put(None)
        threads = [*self._threads, self._restarter]
        for thread in threads:
            if thread is not None and thread is not threading.current_thread():
                thread.join(remaining(deadline))
                clean = clean and not thread.is_alive()
        return clean

    def _reap(self, child: Child, timeout: float | None) -> bool:
        """End `child`: let it exit for `timeout` s, else kill it; then its socket and folder.

        True if it exited by itself. Only the first call for a child does anything.
        """
        with child.reap_lock:
            if child.reaped:
                return True
            child.reaped = True
            # Shutting our end makes the process see the end of its input and exit, and wakes
            # our reader; the descriptor stays ours until the reader is done (no reuse).
            _shutdown(child.channel)
            exited = True
            try:
                child.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                exited = False
                child.process.kill()
                child.process.wait()
            reader = child.reader
            if reader is not None and reader is not threading.current_thread():
                reader.join(_REAP_S)
            child.channel.close()
            child.folder.remove()
            return exited

    # -- running batches -------------------------------------------------------------------

    def post(self, fn: Callable[[], None]) -> None:
        self._calls.put(fn)

    def _dispatch(self) -> None:
        while (fn := self._calls.get()) is not None:
            try:
                fn()
            except Exception:  # run_batch answers its own failures; this keeps the thread
                log.exception("%s: a call on the dispatch thread failed", self.name)

    def run_batch(self, batch: list[Pending], decoupled: bool) -> None:
        """Send one batch to the process; return once its `execute` returned."""
        with self._state:
            self._state.wait_for(lambda: self._alive or self._stopping, RESTART_WAIT_S)
            child = self._child if self._alive and not self._stopping else None
        if child is None:
            for pending in batch:
                pending.fail(_died(self.name))
            return
        batch_id = next(self._keys)
        executed = threading.Event()
        keys = [next(self._keys) for _ in batch]
        with self._lock:
            # Registered first: if the process dies meanwhile, its reader fails them.
            if not child.exited:
                child.executing[batch_id] = executed
                child.open.update(zip(keys, batch, strict=True))
        if child.exited:
            for pending in batch:
                pending.fail(_died(self.name))
            return
        wires: list[WireRequest] = []
        packed = False
        try:
            for key, pending in zip(keys, batch, strict=True):
                wires.append(pack_request(child.folder, key, pending.request))
            packed = True
            child.channel.send(Execute(batch_id, wires, decoupled))
        except Exception as exc:
            for wire in wires:
                child.folder.discard(wire.inputs)
            if packed and isinstance(exc, OSError):
                message = _died(self.name)  # the socket broke: the process is going
            else:
                message = self._failure(f"could not pass the requests to its process: {exc!r}")
            log.error("%s", message)
            self._fail_batch(child, batch_id, keys, message)
            return
        for key, pending in zip(keys, batch, strict=True):
            # After the send, so a cancel never reaches the process before its request.
            pending.on_cancel(partial(self._outgoing.put, (child, Cancel(key))))
        executed.wait()

    def _fail_batch(self, child: Child, batch_id: int, keys: list[int], message: str) -> None:
        with self._lock:
            child.executing.pop(batch_id, None)
            failed = [p for k in keys if (p := child.open.pop(k, None)) is not None]
        for pending in failed:
            pending.fail(message)

    def _failure(self, what: str) -> str:
        return failed_requests_text(self.name, what)

    def _reply(self) -> None:
        # The replier: a send may wait behind a large message, never on the caller or reader.
        while (item := self._outgoing.get()) is not None:
            child, message = item
            if isinstance(message, Cancel) and message.key not in child.open:
                continue  # answered meanwhile
            try:
                child.channel.send(message)
            except OSError:
                pass  # the process is gone; the reader fails what it held
            except Exception:
                log.exception("%s: could not send %r", self.name, type(message).__name__)

    # -- messages from the process ---------------------------------------------------------

    def _read(self, child: Child) -> None:
        spec = self.spec
        # Who the process's metric families belong to while it runs: bound here only, since
        # this thread runs their operations and ends with the process.
        bound = pb_utils.context.ModelContext(
            spec.model_name, self.name, str(spec.model_file.parent), self.services
        )
        with pb_utils.context.model_context(context=bound, counted=False):
            try:
                while True:
                    message = child.channel.recv()
                    try:
                        self._handle(child, message)
                    except Exception:
                        log.exception("%s: handling %r failed", self.name, type(message).__name__)
            except (EOFError, OSError):
                pass
            except Exception:
                # Unreadable stream: nothing after this can be trusted; treat it as a death.
                log.exception("%s: unreadable message from the instance process", self.name)
                child.process.kill()
        registry_of(bound).release_instance(bound)
        child.metrics.clear()
        self._on_exit(child)

    def _handle(self, child: Child, message: ToParent) -> None:
        match message:
            case Respond():
                self._respond(child, message)
            case Metric():
                self._metric(child, message)
            case Executed(batch_id):
                with self._lock:
                    event = child.executing.pop(batch_id, None)
                if event is not None:
                    event.set()
            case Log(attributes):
                _emit_log(attributes)
            case Bls():
                self._bls.start(child, message)
            case BlsCancel(call):
                self._bls.cancel(child, call)
            case ReadyAnswer(check, reason):
                with self._lock:
                    answer = child.ready_checks.pop(check, None)
                if answer is not None:
                    answer.set_result(reason)
            case Started() | Loaded() | LoadFailed() | Finalized():
                child.replies.put(message)
            case _:
                log.error("%s: unexpected message %r from the process", self.name, message)

    def _metric(self, child: Child, message: Metric) -> None:
        """Run one custom-metric operation for the process; answer it unless it is a release."""
        try:
            value, error = child.metrics.run(message.op, message.args), None
        except Exception as exc:  # the registry's text goes back to the model as it is
            value, error = None, str(exc)
        if message.call:
            self._outgoing.put((child, MetricReply(message.call, error, value)))
        elif error is not None:
            log.debug("%s: releasing a metric failed: %s", self.name, error)

    def _respond(self, child: Child, reply: Respond) -> None:
        key, wire, final = reply.key, reply.response, reply.final
        with self._lock:
            pending = child.open.pop(key, None) if final else child.open.get(key)
        if pending is None:
            return
        try:
            response = unpack_response(child.folder, wire)
        except Exception as exc:
            with self._lock:
                child.open.pop(key, None)
            if wire is not None:
                child.folder.discard(wire.outputs)
            message = self._failure(f"could not read the response of its process: {exc!r}")
            log.error("%s", message)
            pending.fail(message)
            return
        try:
            pending.deliver(response, final, reply.failure)
        except Exception as exc:
            # The caller's respond raised; the request still gets a final answer if it can.
            with self._lock:
                child.open.pop(key, None)
            message = self._failure(f"could not deliver the response: {exc!r}")
            log.error("%s", message)
            pending.fail(message)

    def _on_exit(self, child: Child) -> None:
        """The process is gone: fail what it held, then restart it unless we are stopping."""
        with self._lock:
            child.exited = True
            lost, child.open = list(child.open.values()), {}
            executing, child.executing = list(child.executing.values()), {}
            checks, child.ready_checks = list(child.ready_checks.values()), {}
        message = _died(self.name)
        for pending in lost:
            pending.fail(message)
        for check in checks:
            check.set_exception(RuntimeError(_DIED_WHILE_CHECKING))
        for event in executing:
            event.set()
        child.replies.put(Exited())
        with self._state:
            was_alive = self._child is child and self._alive
            if was_alive:
                self._alive = False
            if not was_alive or self._stopping:
                return  # a failed start, or a stop: whoever started it cleans up
        log.error(
            "%s: instance process exited (code %s); restarting it", self.name, child.process.poll()
        )
        self._health_changed(False)
        self._restarter = threading.Thread(
            target=self._restart, args=(child,), name=f"restart:{self.name}", daemon=True
        )
        self._restarter.start()

    def _restart(self, dead: Child) -> None:
        """Start a new process until one initializes, backing off between failed attempts."""
        with self._state:
            if self._child is dead:
                self._child = None
        self._reap(dead, 0.0)
        delay = self.restart_backoff
        for attempt in itertools.count(1):
            try:
                self._start()
                break
            except Exception as exc:
                # One line per attempt; the model's full text (its traceback) only the first time.
                reason = str(exc) if attempt == 1 else str(exc).split("\n", 1)[0]
                with self._state:
                    if self._stopping:
                        return
                    log.error(
                        "%s: restart attempt %d failed (next in %gs): %s",
                        self.name,
                        attempt,
                        delay,
                        reason,
                    )
                    if self._state.wait_for(lambda: self._stopping, delay):
                        return
                delay = min(delay * 2, self.restart_backoff_cap)
        self.restarts += 1
        log.info("%s: instance process restarted (pid %s)", self.name, self.pid)
        self._health_changed(True)

    # -- readiness (`is_ready()`) -------------------------------------------------------------

    def check_ready(self) -> Reason:
        """Triton's instance readiness: the process is alive, then the model's `is_ready()`."""
        child = self._child
        if not self._alive or child is None:
            return _died(self.name)
        return self._ready_check.check() if child.has_is_ready else None

    def _start_is_ready(self) -> Future[Reason]:
        answer: Future[Reason] = Future()
        child = self._child
        check = next(self._keys)
        with self._lock:
            if child is None or child.exited:
                answer.set_exception(RuntimeError(_DIED_WHILE_CHECKING))
                return answer
            child.ready_checks[check] = answer
        self._outgoing.put((child, IsReady(check)))
        return answer

    def _health_changed(self, alive: bool) -> None:
        if self.on_health_change is not None:
            self.on_health_change(alive)

    def kill(self) -> None:
        """SIGKILL the process (tests use this to check the restart)."""
        child = self._child
        if child is not None and child.process.poll() is None:
            os.kill(child.process.pid, 9)


def _next_reply(child: Child, timeout: float | None) -> Reply | None:
    """The process's next reply (Exited if it died), or None after `timeout` seconds."""
    try:
        return child.replies.get(timeout=timeout)
    except queue.Empty:
        return None


def _shutdown(channel: Channel) -> None:
    try:
        sock = socket.socket(fileno=channel.connection.fileno())
    except OSError:
        return  # already closed
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.detach()  # the Connection still owns the descriptor


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _child_environment(environment: ExecutionEnvironment | None = None) -> dict[str, str]:
    # The child imports this package by name: make sure it finds the same copy we run.
    env = dict(os.environ)
    if environment is not None:
        return environment.process_environment(env)
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    return env


# python_backend's text when the stub dies while a check waits for `is_ready()`.
_DIED_WHILE_CHECKING = (
    "Stub process is not healthy while waiting for user-defined is_ready() response"
)


def _died(name: str) -> str:
    return f"Stub process '{name}' is not healthy."


def _emit_log(attributes: dict[str, Any]) -> None:
    record = logging.makeLogRecord(attributes)
    logging.getLogger(record.name).handle(record)
