"""A model's own readiness, in-process through load_repository (no server): python_backend's
`is_ready()` (26.03 on) and the dead-stub check (26.01 on), for thread and process instances.

Texts are python_backend's (src/python_be.cc, src/pb_stub.cc at v2.71.0's python_backend).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from model_repository_loader.inference import InferRequest, answer_of
from model_repository_loader.loader import LoadedRepository, load_repository
from model_repository_loader.pb_utils import Tensor
from model_repository_loader.readiness import NOT_BOOLEAN, TIMED_OUT
from tests.e2e.support import wait_until

MODEL = """\
import asyncio
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.answer = params["ANSWER"]["string_value"]
        self.delay = float(params["DELAY"]["string_value"])
        self.calls = 0

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]
            )
            for r in requests
        ]

    def is_ready(self):
        self.calls += 1
        if self.answer == "coroutine":
            return self.ready_later()
        time.sleep(self.delay)
        if self.answer == "exception":
            raise RuntimeError("Internal check failed")
        return {"true": True, "false": False}.get(self.answer, "ready")

    async def ready_later(self):
        await asyncio.sleep(self.delay)
        return True
"""
NO_IS_READY = MODEL.replace("def is_ready(self):", "def not_is_ready(self):")
CONFIG = """\
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "ANSWER" value {{ string_value: "{answer}" }} }}
parameters {{ key: "DELAY" value {{ string_value: "{delay}" }} }}
parameters {{ key: "BRIDGE_INSTANCE_KIND" value {{ string_value: "{kind}" }} }}
"""


def lay_out(root: Path, name: str, answer: str, kind: str, delay: float = 0.0) -> None:
    folder = root / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(NO_IS_READY if answer == "none" else MODEL)
    (folder / "config.pbtxt").write_text(CONFIG.format(answer=answer, delay=delay, kind=kind))


@pytest.fixture
def load(tmp_path: Path) -> Iterator:
    loaded: list[LoadedRepository] = []

    def load(answer: str, kind: str = "thread", delay: float = 0.0) -> object:
        lay_out(tmp_path, "m", answer, kind, delay)
        loaded.append(load_repository([tmp_path]))
        return loaded[-1].models["m"].latest

    yield load
    for repository in loaded:
        repository.close()


@pytest.mark.parametrize("kind", ["thread", "process"])
@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ("none", None),
        ("true", None),
        ("coroutine", None),
        ("false", "Model 'm_0_0' is not ready (user-defined check failed)."),
        ("non_boolean", NOT_BOOLEAN),
    ],
)
def test_is_ready_decides(load, kind: str, answer: str, reason: str | None) -> None:
    version = load(answer, kind)
    assert version.check_ready() == reason
    assert version.check_ready() == reason  # every check asks again


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_an_exception_is_not_ready_with_its_python_error(load, kind: str) -> None:
    reason = load("exception", kind).check_ready()
    assert reason.startswith("RuntimeError: Internal check failed\n\nAt:\n"), reason
    assert "): is_ready\n" in reason


def test_one_check_in_flight_answers_every_caller(load) -> None:
    version = load("true", delay=1.0)
    answers: list[object] = []
    callers = [
        threading.Thread(target=lambda: answers.append(version.check_ready())) for _ in range(8)
    ]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert answers == [None] * 8
    assert version.instances[0].model.calls == 1


def test_a_slow_answer_is_not_ready_then_answers_the_next_check(load) -> None:
    version = load("true", delay=6.0)
    started = time.monotonic()
    assert version.check_ready() == TIMED_OUT  # python_backend's 5 s bound
    assert 4.5 < time.monotonic() - started < 6.0
    # The call goes on; the next check waits for it instead of starting another.
    assert version.check_ready() is None
    assert version.instances[0].model.calls == 1


def test_a_slow_is_ready_never_holds_execute_up(load) -> None:
    version = load("true", delay=3.0)
    checking = threading.Thread(target=version.check_ready)
    checking.start()
    started = time.monotonic()
    request = InferRequest(inputs=[Tensor("IN", np.array([1.0], np.float32))])
    out = answer_of(version.submit, request, 10.0, "m")
    assert out.output_tensors()[0].as_numpy().tolist() == [1.0]
    assert time.monotonic() - started < 1.0
    checking.join()


def test_a_dead_instance_process_is_not_ready_until_it_is_back(load) -> None:
    version = load("none", "process")
    assert version.check_ready() is None
    version.instances[0].kill()
    wait_until(lambda: not version.instances[0].alive, "the process seen dead")
    assert version.check_ready() == "Stub process 'm_0_0' is not healthy."
    wait_until(lambda: version.check_ready() is None, "the process restarted", timeout=30)
