"""Process instances under faults: nothing hangs, nothing leaks, the instance goes on serving.

Repository: tests/repositories/isolation_faults (see its README), copied per test. Faults go in
at real seams: the shared-memory writer and reader in this process (patched to raise), the same
writer in the instance process (through a `sitecustomize` on the child's PYTHONPATH, since the
child is a real interpreter), `subprocess.Popen` and the segment folder raising OSError, models
that hang in `initialize` or `execute` on a gate file, or fail `initialize` while a marker
exists. Order comes from events and files, never from sleeping.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from model_repository_loader import pb_utils
from model_repository_loader.errors import ModelLoadError
from model_repository_loader.inference import InferRequest
from model_repository_loader.instance import InstanceSpec
from model_repository_loader.isolation import IsolatedInstance, tensors
from model_repository_loader.isolation import instance as isolated
from model_repository_loader.isolation.tensors import SHARED_MEMORY_MIN_BYTES, SegmentFolder
from model_repository_loader.loader import LoadedRepository, load_repository
from tests.harness.repositories import materialize

REPOSITORIES = Path(__file__).resolve().parents[1] / "repositories"
BIG = np.arange(4 * SHARED_MEMORY_MIN_BYTES // 4, dtype=np.float32)  # crosses through /dev/shm

# Imported by every child interpreter started while its folder is on PYTHONPATH: it patches
# the shared-memory writer there (FAULT_WRITE_ERRNO, while FAULT_WHILE exists), or holds the
# start-up until FAULT_START_GATE exists.
SITECUSTOMIZE = """
import os, time
if os.environ.get("FAULT_START_GATE"):
    while not os.path.exists(os.environ["FAULT_START_GATE"]):
        time.sleep(0.05)
if os.environ.get("FAULT_WRITE_ERRNO"):
    from model_repository_loader.isolation import tensors
    _write = tensors.SegmentFolder._write_segment
    def _faulty(self, array, _code=int(os.environ["FAULT_WRITE_ERRNO"])):
        if os.path.exists(os.environ["FAULT_WHILE"]):
            raise OSError(_code, os.strerror(_code), str(self.path))
        return _write(self, array)
    tensors.SegmentFolder._write_segment = _faulty
"""


@pytest.fixture(autouse=True)
def _log_level(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)  # instance processes take the level in force at start


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    return Path(shutil.copytree(REPOSITORIES / "isolation_faults", tmp_path / "repo"))


@pytest.fixture
def load(copy: Path) -> Iterator[Callable[..., LoadedRepository]]:
    opened: list[LoadedRepository] = []

    def _load(*names: str, extra: list[Path] | None = None) -> LoadedRepository:
        loaded = load_repository([copy, *(extra or [])], only=set(names))
        opened.append(loaded)
        return loaded

    yield _load
    for loaded in opened:
        loaded.close()


@pytest.fixture
def child_faults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder whose sitecustomize.py every instance process started from now on imports."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    )
    return site


def _infer(loaded: LoadedRepository, model: str, x: np.ndarray) -> pb_utils.InferenceResponse:
    # Bounded: the defects under test made these wait forever.
    return loaded.models[model].infer(InferRequest(inputs=[pb_utils.Tensor("X", x)]), timeout=30)


def _y(response: pb_utils.InferenceResponse) -> np.ndarray:
    assert not response.has_error(), response.error()
    return pb_utils.get_output_tensor_by_name(response, "Y").as_numpy()


def _error(response: pb_utils.InferenceResponse) -> pb_utils.TritonError:
    error = response.error()
    assert error is not None, "expected an error response"
    return error


def _children() -> list[int]:
    """PIDs of this process's instance processes still in the process table (zombies too)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == os.getpid() and b"isolation.child" in cmdline:
            found.append(int(entry.name))
    return found


def _folders(label: str) -> list[Path]:
    return list(tensors._SHM_ROOT.glob(f"dynamo-bridge-{os.getpid()}-{label}*"))


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)


def _errors(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR and text in r.getMessage()]


# -- item 1: a failure on the path fails the batch, and the instance goes on -------------------


def test_input_write_failure_fails_the_batch_and_the_instance_serves_on(
    load, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    loaded = load("double")

    def broken(self, array):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(SegmentFolder, "_write_segment", broken)
    error = _error(_infer(loaded, "double", BIG))
    assert error.code() == pb_utils.TritonError.INTERNAL
    assert error.message().startswith(
        "Failed to process the request(s) for model 'double_0_0', message: could not pass the "
        "requests to its process: "
    )
    assert "Input/output error" in error.message()
    assert len(_errors(caplog, "could not pass the requests")) == 1  # logged once
    monkeypatch.undo()
    np.testing.assert_array_equal(_y(_infer(loaded, "double", BIG)), BIG * 2)
    assert loaded.models["double"].ready


def test_full_shared_memory_sends_inputs_inline_and_warns_once(
    load, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    loaded = load("double")

    def full(self, array):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))

    monkeypatch.setattr(SegmentFolder, "_write_segment", full)
    for _ in range(2):
        np.testing.assert_array_equal(_y(_infer(loaded, "double", BIG)), BIG * 2)
    warnings = [r for r in caplog.records if "shared memory is full" in r.getMessage()]
    assert len(warnings) == 1
    assert "--shm-size" in warnings[0].getMessage()


def test_response_read_failure_fails_that_request_and_the_reader_goes_on(
    load, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    loaded = load("double")

    def broken(self, name, dtype, count):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(SegmentFolder, "_read_segment", broken)
    error = _error(_infer(loaded, "double", BIG))
    assert error.code() == pb_utils.TritonError.INTERNAL
    assert "could not read the response of its process" in error.message()
    assert len(_errors(caplog, "could not read the response")) == 1
    monkeypatch.undo()
    np.testing.assert_array_equal(_y(_infer(loaded, "double", BIG)), BIG * 2)


def test_output_write_failure_in_the_process_fails_that_request(
    load, copy: Path, child_faults: Path, monkeypatch: pytest.MonkeyPatch
):
    marker = copy / "broken_writer"
    monkeypatch.setenv("FAULT_WRITE_ERRNO", str(errno.EIO))
    monkeypatch.setenv("FAULT_WHILE", str(marker))
    loaded = load("double")
    marker.touch()
    error = _error(_infer(loaded, "double", BIG))
    assert error.code() == pb_utils.TritonError.INTERNAL
    assert error.message().startswith(
        "Failed to process the request(s) for model 'double_0_0', message: could not pass the "
        "response out: "
    )
    marker.unlink()
    np.testing.assert_array_equal(_y(_infer(loaded, "double", BIG)), BIG * 2)


def test_full_shared_memory_in_the_process_sends_outputs_inline(
    load, copy: Path, child_faults: Path, monkeypatch: pytest.MonkeyPatch, caplog
):
    marker = copy / "full"
    marker.touch()
    monkeypatch.setenv("FAULT_WRITE_ERRNO", str(errno.ENOSPC))
    monkeypatch.setenv("FAULT_WHILE", str(marker))
    loaded = load("double")
    for _ in range(2):
        np.testing.assert_array_equal(_y(_infer(loaded, "double", BIG)), BIG * 2)
    # The warning comes from the instance process, through its log forwarding.
    warnings = [r for r in caplog.records if "shared memory is full" in r.getMessage()]
    assert len(warnings) == 1


@pytest.fixture
def tiny_shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A real 192 KiB tmpfs as the segment root (needs root; skipped elsewhere)."""
    mount = tmp_path / "shm"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=192k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    monkeypatch.setattr(tensors, "_SHM_ROOT", mount)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_really_full_shared_memory_on_both_sides(load, tiny_shm: Path, caplog):
    loaded = load("double")
    # 256 KiB do not fit in 192 KiB: each side's write fails part-way with a real ENOSPC.
    for _ in range(2):
        np.testing.assert_array_equal(_y(_infer(loaded, "double", BIG)), BIG * 2)
    warnings = [r for r in caplog.records if "shared memory is full" in r.getMessage()]
    assert len(warnings) == 2  # once here (inputs), once in the process (outputs)
    # The partly written segments were given back.
    assert [p for p in tiny_shm.rglob("*") if p.is_file()] == []


# -- item 2: bounded waits ---------------------------------------------------------------------


def test_bls_call_whose_forwarding_fails_gets_an_error_answer(
    load, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    # bls_caller (a process) calls thread_pids (here) with X: reading X from shared memory
    # here fails, so the forwarding thread raises. The model must get an answer, not wait.
    loaded = load("bls_caller", "thread_pids", extra=[materialize("isolation", tmp_path)])

    def broken(self, name, dtype, count):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(SegmentFolder, "_read_segment", broken)
    error = _error(_infer(loaded, "bls_caller", BIG))
    assert error.code() == pb_utils.TritonError.INTERNAL
    assert "BLS call from instance 'bls_caller_0_0' failed in the server process" in error.message()
    monkeypatch.undo()
    out = _infer(loaded, "bls_caller", BIG)
    np.testing.assert_array_equal(_y(out), BIG * 2)


def test_initialize_that_hangs_fails_the_load_and_leaves_nothing(load, copy: Path):
    fds = len(os.listdir("/proc/self/fd"))
    loaded = load("init_gate")  # its config bounds initialize at 1 s; the gate never opens
    reason = loaded.statuses["init_gate"].reason
    assert "init_gate" not in loaded.models
    assert reason == (
        "Internal: initialize of instance 'init_gate_0_0' did not finish within 1 s (model config "
        "parameter BRIDGE_INITIALIZE_TIMEOUT_SECONDS); its process was stopped"
    )
    assert (copy / "init_gate" / "initializing").exists()  # it did hang in initialize
    assert _children() == []
    assert _folders("init_gate") == []
    assert len(os.listdir("/proc/self/fd")) == fds


def test_initialize_bound_must_be_a_positive_number(load, copy: Path):
    config = copy / "init_gate" / "config.pbtxt"
    config.write_text(config.read_text().replace('string_value: "1"', 'string_value: "soon"'))
    loaded = load("init_gate")
    assert loaded.statuses["init_gate"].reason == (
        "Invalid argument: parameter 'BRIDGE_INITIALIZE_TIMEOUT_SECONDS' of model 'init_gate' "
        "is 'soon'; expected a positive number of seconds"
    )
    assert not (copy / "init_gate" / "initializing").exists()  # refused before starting
    assert _children() == []


def test_process_that_never_starts_fails_the_load_and_leaves_nothing(
    copy: Path, tmp_path: Path, child_faults: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("FAULT_START_GATE", str(tmp_path / "never"))
    spec = InstanceSpec("double", "double_0_0", "CPU", 0, copy / "double" / "1" / "model.py", 1, {})
    fds = len(os.listdir("/proc/self/fd"))
    instance = IsolatedInstance(spec, start_timeout=1.0)
    try:
        with pytest.raises(ModelLoadError) as failure:
            instance.load()
        assert str(failure.value) == (
            "Internal: the process of instance 'double_0_0' did not start within 1 s; it was "
            "stopped"
        )
        assert _children() == []
        assert _folders("double") == []
    finally:
        assert instance.stop(10)
    assert len(os.listdir("/proc/self/fd")) == fds


# -- item 3: a failed restart is retried with backoff ------------------------------------------


def test_failed_restart_is_retried_until_the_model_is_ready_again(
    load, copy: Path, caplog: pytest.LogCaptureFixture
):
    loaded = load("flaky_init")
    model = loaded.models["flaky_init"]
    changes: list[bool] = []
    ready_again = threading.Event()

    def listener(ready: bool) -> None:
        changes.append(ready)
        if ready and False in changes:
            ready_again.set()

    model.watch_readiness(listener)
    instance = model.latest.instances[0]
    assert isinstance(instance, IsolatedInstance)
    first = _infer(loaded, "flaky_init", BIG[:4]).output_tensors()[0].as_numpy()[0]
    (copy / "flaky_init" / "fail_init").touch()
    instance.kill()
    _wait_for(lambda: len(_errors(caplog, "restart attempt")) >= 2, "two failed restarts")
    (copy / "flaky_init" / "fail_init").unlink()
    assert ready_again.wait(60), "the model never became ready again"
    assert model.ready and instance.alive and instance.restarts == 1
    second = _infer(loaded, "flaky_init", BIG[:4]).output_tensors()[0].as_numpy()[0]
    assert second != first
    failures = _errors(caplog, "restart attempt")
    # One line per attempt, numbered in order, no traceback attached.
    assert all(f"restart attempt {n} failed" in r.getMessage() for n, r in enumerate(failures, 1))
    assert all(r.exc_info is None for r in failures)
    assert "flaky_init: fail_init is present" in failures[0].getMessage()


# -- item 4: an OSError while starting is a failed load, and nothing is left ---------------------


@pytest.mark.parametrize("seam", ["popen", "segment folder"])
def test_oserror_starting_an_instance_fails_the_load_and_stops_the_others(
    seam: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    copy = materialize("isolation", tmp_path)
    started: list[subprocess.Popen[bytes]] = []
    calls = []
    real_popen, real_create = subprocess.Popen, SegmentFolder.create.__func__

    def popen(*args, **kwargs):
        calls.append("popen")
        if seam == "popen" and calls.count("popen") == 2:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    def create(cls, label):
        calls.append("create")
        if seam == "segment folder" and calls.count("create") == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/dev/shm/x")
        return real_create(cls, label)

    monkeypatch.setattr(isolated.subprocess, "Popen", popen)
    monkeypatch.setattr(SegmentFolder, "create", classmethod(create))
    loaded = load_repository([copy], only={"proc_pids"})  # two process instances
    try:
        assert "proc_pids" not in loaded.models
        reason = loaded.statuses["proc_pids"].reason
        assert reason.startswith(
            "Internal: could not start the process of instance 'proc_pids_0_1': "
        )
        assert ("Too many open files" if seam == "popen" else "No space left") in reason
        assert len(started) == 1 and started[0].returncode is not None  # the first: reaped
        assert _children() == []
        assert _folders("proc_pids") == []
    finally:
        loaded.close()


# -- item 5: a cancel never blocks the caller ---------------------------------------------------


def test_cancel_does_not_wait_for_a_send_in_progress(load, copy: Path):
    loaded = load("hang_execute")
    answered = threading.Event()
    answers: list[pb_utils.InferenceResponse | None] = []

    def respond(response: pb_utils.InferenceResponse | None, final: bool) -> None:
        answers.append(response)
        if final:
            answered.set()

    pending = loaded.models["hang_execute"].submit(
        InferRequest(inputs=[pb_utils.Tensor("X", np.ones(2, np.float32))]), respond
    )
    assert pending is not None
    _wait_for(lambda: (copy / "hang_execute" / "started").exists(), "execute to start")
    instance = loaded.models["hang_execute"].latest.instances[0]
    channel = instance._child.channel
    cancelled = threading.Thread(target=pending.cancel)
    # The send lock held, as a large message being sent holds it.
    with channel._send_lock:
        cancelled.start()
        cancelled.join(10)
        returned = not cancelled.is_alive()
    assert returned, "cancel() waited for the channel"
    assert answered.wait(10), "the cancellation never reached the process"
    assert _error(answers[-1]).code() == pb_utils.TritonError.CANCELLED


# -- item 6: finalize is bounded -----------------------------------------------------------------


def test_finalize_with_an_execute_that_never_returns_is_bounded(load, copy: Path):
    loaded = load("hang_execute")
    answers: list[pb_utils.InferenceResponse | None] = []
    answered = threading.Event()

    def respond(response: pb_utils.InferenceResponse | None, final: bool) -> None:
        answers.append(response)
        if final:
            answered.set()

    loaded.models["hang_execute"].submit(
        InferRequest(inputs=[pb_utils.Tensor("X", np.ones(2, np.float32))]), respond
    )
    _wait_for(lambda: (copy / "hang_execute" / "started").exists(), "execute to start")
    instance = loaded.models["hang_execute"].latest.instances[0]
    begin = time.monotonic()
    assert instance.finalize(timeout=1.0) is False
    assert time.monotonic() - begin < 15, "finalize ignored its bound"  # not 68 s
    assert _children() == []
    assert _folders("hang_execute") == []
    # The request held by the killed process is answered, not left open.
    assert answered.wait(10)
    assert _error(answers[-1]).message() == "Stub process 'hang_execute_0_0' is not healthy."
