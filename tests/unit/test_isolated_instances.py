"""Process-isolated instances, in-process through load_repository (no server).

Repository: tests/repositories/isolation. Each test copies it, since `crash` writes a marker.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from model_repository_loader import pb_utils
from model_repository_loader.config import ConfigOptions
from model_repository_loader.inference import InferRequest
from model_repository_loader.isolation import IsolatedInstance
from model_repository_loader.loader import LoadedRepository, load_repository
from tests.harness.repositories import materialize


@pytest.fixture
def repo(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> Iterator[LoadedRepository]:
    # Instance processes take the log level in force when they start.
    caplog.set_level(logging.INFO)
    copy = materialize("isolation", tmp_path)
    loaded = load_repository(
        [copy], only={"proc_pids", "thread_pids", "bls_caller", "cancel_aware"}
    )
    yield loaded
    loaded.close()


def _x(values: list[float]) -> list[pb_utils.Tensor]:
    return [pb_utils.Tensor("X", np.array(values, np.float32))]


def _outputs(response: pb_utils.InferenceResponse) -> dict[str, np.ndarray]:
    assert not response.has_error(), response.error()
    return {t.name(): t.as_numpy() for t in response.output_tensors()}


def test_kinds_follow_the_rule(repo: LoadedRepository):
    proc = repo.models["proc_pids"].latest.instances
    thread = repo.models["thread_pids"].latest.instances
    assert [type(i) for i in proc] == [IsolatedInstance, IsolatedInstance]
    assert not any(isinstance(i, IsolatedInstance) for i in thread)
    assert all(i.pid not in (None, os.getpid()) for i in proc)


def test_answers_cross_the_process_boundary(repo: LoadedRepository):
    big = np.arange(100_000, dtype=np.float32)  # over the shared-memory threshold
    out = _outputs(repo.models["proc_pids"].infer(InferRequest(inputs=_x(big.tolist()))))
    np.testing.assert_array_equal(out["Y"], big * 2)
    assert out["PID"][0] != os.getpid()
    assert out["INSTANCE"][0] in (b"proc_pids_0_0", b"proc_pids_0_1")


def test_bls_from_a_process_reaches_a_model_in_this_one(repo: LoadedRepository, caplog):
    out = _outputs(repo.models["bls_caller"].infer(InferRequest(inputs=_x([1.0, 2.5]))))
    np.testing.assert_array_equal(out["Y"], np.array([2.0, 5.0], np.float32))
    assert out["CALLEE_PID"][0] == os.getpid() != out["CALLER_PID"][0]
    # The model's log line came out of its process into this one's logging.
    lines = [r for r in caplog.records if r.name == pb_utils.logger.LOGGER_NAME]
    assert any(f"from pid {out['CALLER_PID'][0]}" in r.getMessage() for r in lines)
    assert any(r.filename == "model.py" for r in lines)


def test_unknown_kind_fails_the_load(tmp_path: Path):
    copy = materialize("isolation", tmp_path)
    config = copy / "crash" / "config.pbtxt"
    config.write_text(config.read_text().replace('"process"', '"fork"'))
    loaded = load_repository([copy], only={"crash"})
    try:
        assert "crash" not in loaded.models
        assert "BRIDGE_INSTANCE_KIND" in loaded.statuses["crash"].reason
    finally:
        loaded.close()


def test_server_default_kind_applies_without_the_parameter(tmp_path: Path):
    copy = materialize("isolation", tmp_path)
    loaded = load_repository([copy], ConfigOptions(instance_kind="thread"), only={"proc_pids"})
    try:
        assert not any(
            isinstance(i, IsolatedInstance) for i in loaded.models["proc_pids"].latest.instances
        )
    finally:
        loaded.close()


def test_cancel_reaches_the_instance_process(repo: LoadedRepository):
    answered = threading.Event()
    answers: list[pb_utils.InferenceResponse | None] = []

    def respond(response: pb_utils.InferenceResponse | None, final: bool) -> None:
        answers.append(response)
        if final:
            answered.set()

    steps = [pb_utils.Tensor("STEPS", np.array([1000], np.int32))]  # 20 s if never cancelled
    pending = repo.models["cancel_aware"].submit(InferRequest(inputs=steps), respond)
    assert pending is not None
    assert not answered.wait(0.3)  # running
    pending.cancel()
    assert answered.wait(10), "the model never saw the cancellation"
    error = answers[-1].error() if answers[-1] is not None else None
    assert error is not None and error.code() == pb_utils.TritonError.CANCELLED
    assert error.message().startswith("cancelled after ")
