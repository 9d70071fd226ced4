"""No request may hang and no closed model may stay in memory (issue 16), in-process instances.

Faults go in at the real seams: a `respond` callback that raises, a model whose `execute` blocks
until the test lets it go, a closed model, cancellations queued behind a blocked instance. The
models are written to a temporary repository and loaded with `load_repository`, as the bridge
loads them. The blocking models wait on events of a module the test puts in `sys.modules`, so
the test orders events instead of sleeping.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import textwrap
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_repository_loader import pb_utils
from model_repository_loader.execution import RESPOND_FAILED, Pending
from model_repository_loader.inference import InferRequest
from model_repository_loader.instance import InstanceSpec, ModelInstance
from model_repository_loader.loader import LoadedRepository, load_repository
from model_repository_loader.model import unavailable_text

WAIT_S = 10.0  # only catches a hang; never an expected duration
UNAVAILABLE = pb_utils.TritonError.UNAVAILABLE
CANCELLED = pb_utils.TritonError.CANCELLED
INTERNAL = pb_utils.TritonError.INTERNAL

SCHEDULERS = {
    "default": "",
    "dynamic": "dynamic_batching { }",
    "ordered": "dynamic_batching { preserve_ordering: true }",
    "sequence": "sequence_batching { }",
}

ECHO = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]
                )
                for r in requests
            ]
"""

# Blocks inside execute until the test sets `gates.release` (a module the test installs).
BLOCKING = """
    import _hardening_gates as gates
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            gates.entered.set()
            gates.release.wait()
            return [
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]
                )
                for r in requests
            ]
"""


@pytest.fixture
def gates() -> Iterator[types.SimpleNamespace]:
    module = types.ModuleType("_hardening_gates")
    module.entered = threading.Event()
    module.release = threading.Event()
    sys.modules["_hardening_gates"] = module
    yield module  # type: ignore[misc]
    module.release.set()  # never leave a model thread blocked behind the test
    sys.modules.pop("_hardening_gates", None)


def write_model(
    root: Path, name: str, source: str, extra: str = "", max_batch_size: int = 0
) -> None:
    """One model folder: IN -> OUT (INT32, variable length), one in-process instance."""
    folder = root / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(textwrap.dedent(source))
    (folder / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch_size}\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
        "instance_group [ { kind: KIND_CPU count: 1 } ]\n" + extra
    )


@pytest.fixture
def repo(tmp_path: Path) -> Iterator[Callable[..., LoadedRepository]]:
    """`repo(name, source, extra="", max_batch_size=0)`: load one model from `source`."""
    loaded: list[LoadedRepository] = []

    def make(name: str, source: str, extra: str = "", max_batch_size: int = 0) -> LoadedRepository:
        write_model(tmp_path, name, source, extra, max_batch_size)
        repository = load_repository([tmp_path], only=[name])
        assert not repository.failures, repository.failures
        loaded.append(repository)
        return repository

    yield make
    for repository in loaded:
        repository.close()


class Answers:
    """A `respond` callback that keeps what it is given; `fail_data` makes it raise on data."""

    def __init__(self, fail_data: bool = False) -> None:
        self.fail_data = fail_data
        self.items: list[tuple[pb_utils.InferenceResponse | None, bool]] = []
        self.closed = threading.Event()

    def __call__(self, response: pb_utils.InferenceResponse | None, final: bool) -> None:
        if self.fail_data and response is not None and not response.has_error():
            raise RuntimeError("the encoder broke")
        self.items.append((response, final))
        if final:
            self.closed.set()

    def error(self) -> tuple[str, Any]:
        assert self.closed.wait(WAIT_S), f"never answered: {self.items}"
        response = self.items[-1][0]
        assert response is not None and response.has_error(), response
        return response.error().message(), response.error().code()

    def values(self) -> list[int]:
        assert self.closed.wait(WAIT_S), f"never answered: {self.items}"
        response = self.items[-1][0]
        assert response is not None and not response.has_error(), response.error().message()
        return response.output_tensors()[0].as_numpy().tolist()


def request(value: int, scheduler: str = "default", corrid: int = 1, **params: Any) -> InferRequest:
    if scheduler == "sequence":
        params = {"sequence_id": corrid, "sequence_start": True, "sequence_end": True, **params}
    return InferRequest(
        inputs=[pb_utils.Tensor("IN", np.array([value], np.int32))], parameters=params
    )


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


# -- 1. an exception on the response path -------------------------------------------------------


def test_instance_thread_survives_a_raising_call():
    spec = InstanceSpec("m", "m_0", "CPU", 0, Path(__file__), 1, {})
    instance = ModelInstance(spec)
    try:
        instance.post(lambda: 1 / 0)
        done = threading.Event()
        instance.post(done.set)
        assert done.wait(WAIT_S), "the instance thread died with the first call"
    finally:
        instance.stop()


@pytest.mark.parametrize("scheduler", list(SCHEDULERS))
def test_raising_respond_fails_its_request_and_the_instance_goes_on(repo, scheduler, caplog):
    model = repo("echo", ECHO, SCHEDULERS[scheduler]).models["echo"]
    broken = Answers(fail_data=True)
    with caplog.at_level(logging.ERROR):
        model.submit(request(1, scheduler, corrid=1), broken)
        message, code = broken.error()
    assert code == INTERNAL
    assert message == RESPOND_FAILED + "RuntimeError: the encoder broke"
    assert len([r for r in caplog.records if RESPOND_FAILED in r.getMessage()]) == 1
    # The same instance serves the next request (on the old code its thread was gone).
    after = Answers()
    model.submit(request(2, scheduler, corrid=2), after)
    assert after.values() == [2]


def test_sequence_batch_that_cannot_be_prepared_fails_and_the_slot_goes_on(repo, monkeypatch):
    model = repo("seq", ECHO, SCHEDULERS["sequence"]).models["seq"]
    controls = model.latest._scheduler._controls
    real = controls.tensors
    calls = [0]

    def tensors_failing_once(*args: Any, **kwargs: Any) -> list:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("bad control")
        return real(*args, **kwargs)

    monkeypatch.setattr(controls, "tensors", tensors_failing_once)
    first = Answers()
    model.submit(request(1, "sequence", corrid=1), first)
    message, code = first.error()
    assert code == INTERNAL and message.endswith("internal error: RuntimeError: bad control")
    second = Answers()
    model.submit(request(2, "sequence", corrid=2), second)
    assert second.values() == [2]


def test_a_sender_whose_respond_raises_does_not_raise_into_the_model(repo, tmp_path):
    source = """
        import json
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                for r in requests:
                    sender = r.get_response_sender()
                    x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
                    try:
                        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
                        status = "sent"
                    except Exception as exc:
                        status = repr(exc)
                    with open(json.loads(r.parameters())["report"], "w") as report:
                        report.write(status)
                return None
    """
    model = repo("stream", source, "model_transaction_policy { decoupled: true }").models["stream"]
    report = tmp_path / "report.txt"
    broken = Answers(fail_data=True)
    model.submit(request(1, report=str(report)), broken)
    message, code = broken.error()
    assert code == INTERNAL and message.startswith(RESPOND_FAILED)
    wait_for(lambda: report.exists() and report.read_text() != "", "the model's report")
    assert report.read_text() == "sent", "send() raised into the model"


# -- 2. a closed model ---------------------------------------------------------------------------


def test_a_closed_model_answers_unavailable_at_once(repo):
    model = repo("echo", ECHO).models["echo"]
    model.close()
    response = model.infer(request(1), timeout=WAIT_S)
    assert response.has_error()
    assert response.error().code() == UNAVAILABLE
    assert response.error().message() == unavailable_text("echo", 1)


def test_bls_into_a_closed_model_answers(tmp_path):
    caller = """
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                out = []
                for r in requests:
                    inner = pb_utils.InferenceRequest(
                        model_name="echo",
                        inputs=[pb_utils.get_input_tensor_by_name(r, "IN")],
                        requested_output_names=["OUT"],
                    ).exec()
                    error = inner.error() if inner.has_error() else None
                    out.append(pb_utils.InferenceResponse(inner.output_tensors(), error=error))
                return out
    """
    for name, source in (("echo", ECHO), ("caller", caller)):
        write_model(tmp_path, name, source)
    loaded = load_repository([tmp_path])
    try:
        assert not loaded.failures, loaded.failures
        assert loaded.models["caller"].infer(request(3), timeout=WAIT_S).output_tensors()
        loaded.models["echo"].close()
        response = loaded.models["caller"].infer(request(3), timeout=WAIT_S)
        assert response.has_error()
        assert unavailable_text("echo", 1) in response.error().message()
    finally:
        loaded.close()


# -- 4. a bounded close when execute never returns ------------------------------------------------


@pytest.mark.parametrize("scheduler", list(SCHEDULERS))
def test_close_is_bounded_and_answers_everything(repo, gates, scheduler, caplog):
    model = repo("hung", BLOCKING, SCHEDULERS[scheduler]).models["hung"]
    running, queued = Answers(), Answers()
    model.submit(request(1, scheduler, corrid=1), running)
    assert gates.entered.wait(WAIT_S)
    model.submit(request(2, scheduler, corrid=2), queued)
    finished: list[bool] = []
    closer = threading.Thread(target=lambda: finished.append(model.close(timeout=0.5)))
    with caplog.at_level(logging.ERROR):
        closer.start()
        closer.join(WAIT_S)
    assert not closer.is_alive(), "close() did not return at its bound"
    assert finished == [False]
    text = unavailable_text("hung", 1)
    assert running.error() == (text, UNAVAILABLE)
    assert queued.error() == (text, UNAVAILABLE)
    assert any("abandoned" in r.getMessage() for r in caplog.records)
    # A late answer from the hung execute goes nowhere: the request was closed once.
    gates.release.set()
    late = Answers()
    model.submit(request(3, scheduler, corrid=3), late)
    assert late.error() == (text, UNAVAILABLE)
    assert len(running.items) == 1


def test_close_lets_a_decoupled_model_finish_its_streams_in_finalize(repo, gates):
    # As Triton's decoupled examples do: responses come from the model's own thread, and
    # finalize waits for those threads. Close must not cut such a stream short.
    source = """
        import threading
        import _hardening_gates as gates
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def initialize(self, args):
                self.threads = []

            def execute(self, requests):
                for r in requests:
                    x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
                    thread = threading.Thread(target=self.answer, args=(r.get_response_sender(), x))
                    thread.start()
                    self.threads.append(thread)
                gates.entered.set()
                return None

            def answer(self, sender, x):
                gates.release.wait()
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

            def finalize(self):
                gates.finalizing.set()
                for thread in self.threads:
                    thread.join()
    """
    gates.finalizing = threading.Event()
    model = repo("stream", source, "model_transaction_policy { decoupled: true }").models["stream"]
    answers = Answers()
    model.submit(request(7), answers)
    assert gates.entered.wait(WAIT_S)
    closer = threading.Thread(target=model.close, kwargs={"timeout": WAIT_S})
    closer.start()
    assert gates.finalizing.wait(WAIT_S)
    gates.release.set()
    closer.join(WAIT_S)
    assert not closer.is_alive()
    assert answers.closed.wait(WAIT_S)
    data = [r for r, _final in answers.items if r is not None]
    assert len(data) == 1 and not data[0].has_error(), data
    assert data[0].output_tensors()[0].as_numpy().tolist() == [7]


def test_bls_caller_waiting_on_a_hung_callee_is_answered_when_it_closes(tmp_path, gates):
    caller = """
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                out = []
                for r in requests:
                    inner = pb_utils.InferenceRequest(
                        model_name="hung",
                        inputs=[pb_utils.get_input_tensor_by_name(r, "IN")],
                        requested_output_names=["OUT"],
                    ).exec()
                    error = inner.error() if inner.has_error() else None
                    out.append(pb_utils.InferenceResponse(inner.output_tensors(), error=error))
                return out
    """
    for name, source in (("hung", BLOCKING), ("caller", caller)):
        write_model(tmp_path, name, source)
    loaded = load_repository([tmp_path])
    try:
        assert not loaded.failures, loaded.failures
        answers = Answers()
        loaded.models["caller"].submit(request(1), answers)
        assert gates.entered.wait(WAIT_S)  # the callee holds the call in execute
        loaded.models["hung"].close(timeout=0.2)
        message, _code = answers.error()
        assert unavailable_text("hung", 1) in message
    finally:
        gates.release.set()
        loaded.close()


# -- 5. cancelled requests behind a blocked instance -----------------------------------------------


def _queued(scheduler: Any) -> int:
    """Requests a scheduler still holds, whatever its kind."""
    if hasattr(scheduler, "_pending"):
        return len(scheduler._pending)
    if hasattr(scheduler, "_ready"):
        return len(scheduler._queue) + sum(len(p.entries) for p in scheduler._ready)
    return sum(len(q) for h in scheduler._instances for q in h.slots) + sum(
        len(q) for q in scheduler._backlog.values()
    )


def _live_pendings() -> int:
    return sum(isinstance(o, Pending) for o in gc.get_objects())


@pytest.mark.parametrize("scheduler", list(SCHEDULERS))
def test_cancelled_requests_leave_the_queue_at_once(repo, gates, scheduler):
    count = 50
    model = repo("hung", BLOCKING, SCHEDULERS[scheduler], max_batch_size=0).models["hung"]
    version = model.latest
    running = Answers()
    model.submit(request(0, scheduler, corrid=1000), running)
    assert gates.entered.wait(WAIT_S)
    gc.collect()
    before = _live_pendings()
    answers = [Answers() for _ in range(count)]
    handles = [model.submit(request(i, scheduler, corrid=i + 1), a) for i, a in enumerate(answers)]
    if hasattr(version._scheduler, "_ready"):
        # The dynamic batcher has formed its next payload and waits for the instance: from
        # here on only the cancellations themselves can take requests out of its queue.
        wait_for(lambda: bool(version._scheduler._ready), "the payload formed ahead")
    assert _queued(version._scheduler) == count
    for handle in handles:
        handle.cancel()
    del handles, handle
    if scheduler != "ordered":
        for a in answers:
            assert a.error() == ("", CANCELLED)
    # preserve_ordering holds the answers (small) until the running request's has gone; the
    # requests themselves are out of the queue and freed all the same.
    wait_for(lambda: _queued(version._scheduler) == 0, "an empty queue")
    gc.collect()
    held = _live_pendings() - before
    assert held == 0, f"{held} cancelled requests are still held"
    assert not gates.release.is_set()  # all of it while the instance was still blocked
    gates.release.set()
    assert running.values() == [0]
    for a in answers:
        assert a.error() == ("", CANCELLED)


# -- 6. a closed version frees its model ---------------------------------------------------------

HEAVY = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.weights = np.ones(16 * 1024 * 1024, dtype=np.float32)  # 64 MiB, touched

        def execute(self, requests):
            return [
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]
                )
                for r in requests
            ]
"""


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _load_serve_close(tmp_path: Path, scheduler: str, kept: list) -> weakref.ref:
    """Load, serve, cancel one request, close; `kept` keeps the closed Model object reachable,
    as a caller may (a late request's handle, a retired generation): its weights must go."""
    if not (tmp_path / "heavy").exists():
        write_model(tmp_path, "heavy", HEAVY, SCHEDULERS[scheduler])
    loaded = load_repository([tmp_path], only=["heavy"])
    assert not loaded.failures, loaded.failures
    model = loaded.models["heavy"]
    ref = weakref.ref(model.latest.instances[0].model)
    for i in range(5):
        assert model.infer(request(i, scheduler, corrid=i + 1), timeout=WAIT_S).output_tensors()
    cancelled = model.submit(request(9, scheduler, corrid=99), Answers())
    assert cancelled is not None
    cancelled.cancel()
    loaded.close()
    kept.append(model)
    return ref


@pytest.mark.parametrize("scheduler", list(SCHEDULERS))
def test_a_closed_model_object_is_freed(tmp_path, scheduler):
    kept: list = []
    ref = _load_serve_close(tmp_path, scheduler, kept)
    gc.collect()
    assert ref() is None, [type(r) for r in gc.get_referrers(ref())]


def test_memory_returns_after_load_close_cycles(tmp_path):
    kept: list = []
    _load_serve_close(tmp_path, "default", kept)  # warm-up: imports, thread stacks, caches
    gc.collect()
    start = _rss()
    for _ in range(5):
        _load_serve_close(tmp_path, "default", kept)
    gc.collect()
    grown = _rss() - start
    # One generation is 64 MiB; five kept alive would be 320 MiB.
    assert grown < 48 * 1024 * 1024, f"RSS grew by {grown / 2**20:.0f} MiB over 5 cycles"
