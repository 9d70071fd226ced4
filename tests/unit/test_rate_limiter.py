"""The rate limiter (`--rate-limit execution_count`): Triton's resource counts and load errors,
the order in which waiting instances get a resource, and resources freed on every way out.

The counting rules and texts are Triton's (core src/rate_limiter.cc, the user guide's
rate_limiter.md); the load error for a count below what an instance asks for is checked against
the oracle in tests/differential/test_diff_rate_limiter.py. Orders are set up with events, never
with sleeps: a resource is held by a gated `execute`, the others are queued until the limiter
says they wait, and the gate is opened.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from model_repository_loader import pb_utils
from model_repository_loader.config import ConfigOptions
from model_repository_loader.errors import TritonStatusError
from model_repository_loader.inference import InferRequest
from model_repository_loader.loader import LoadedRepository, load_repository
from model_repository_loader.scheduling.rate_limiter import (
    RateLimiter,
    ResourceLimit,
    Withdrawn,
    parse_resource_limit,
)
from tests.harness.repositories import materialize, materialize_model

REPO = "rate_limiter"  # tests/repositories: some models share one model.py (materialize)


def group(*resources: tuple[str, int, bool], priority: int = 0) -> mc.ModelInstanceGroup:
    out = mc.ModelInstanceGroup(name="g", count=1)
    out.rate_limiter.priority = priority
    for name, count, is_global in resources:
        resource = out.rate_limiter.resources.add(name=name, count=count)
        setattr(resource, "global", is_global)
    return out


def wait_until(condition, what: str, bound: float = 30.0) -> None:
    """An event the test waits for (bounded only so a broken build fails instead of hanging)."""
    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.005)


# -- the server's counts and Triton's load errors -------------------------------------------


def test_flag_parses_as_tritonserver_reads_it():
    assert parse_resource_limit("R1:10") == ResourceLimit("R1", 10, None)
    assert parse_resource_limit("R2:5:1") == ResourceLimit("R2", 5, 1)
    for bad in ("R1", "R1:1:2:3", "R1:x"):
        with pytest.raises(ValueError) as caught:
            parse_resource_limit(bad)
        assert str(caught.value) == (
            "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
            f"'<resource_name>:<count>'. Got {bad}"
        )


def test_default_count_is_the_largest_asked_for():
    """Without flags a resource has the largest count any instance asks for: two instances of
    2 each run together, a third waits."""
    limiter = RateLimiter()
    small = [limiter.register(f"s{i}", group(("R", 2, False)), 0) for i in range(2)]
    limiter.register("big", group(("R", 4, False)), 0)
    for instance in small:
        limiter.acquire(instance)  # both granted at once: 2 + 2 <= 4
    third = limiter.register("s2", group(("R", 2, False)), 0)
    waiter = threading.Thread(target=limiter.acquire, args=(third,), daemon=True)
    waiter.start()
    wait_until(lambda: limiter.waiting() == 1, "the third instance waits")
    limiter.release(small[0])
    waiter.join(10)
    assert not waiter.is_alive() and limiter.waiting() == 0


def test_explicit_count_below_need_is_tritons_load_error():
    limiter = RateLimiter([ResourceLimit("R", 2)])
    with pytest.raises(TritonStatusError) as caught:
        limiter.register("greedy", group(("R", 4, False)), 0)
    assert str(caught.value) == (
        'Resource count for "R" is limited to 2 which will prevent scheduling of one or more '
        "model instances, the minimum required count is 4"
    )
    assert caught.value.code == pb_utils.TritonError.INVALID_ARG


def test_once_any_flag_is_given_an_unnamed_resource_has_none():
    limiter = RateLimiter([ResourceLimit("OTHER", 8)])
    with pytest.raises(TritonStatusError, match='"R" is limited to 0 .* count is 1$'):
        limiter.register("i", group(("R", 1, False)), 0)


def test_device_flag_counts_only_on_its_device_and_global_takes_the_largest():
    limiter = RateLimiter([ResourceLimit("R", 5, 0), ResourceLimit("R", 8, 1)])
    limiter.register("on1", group(("R", 8, False)), 1)
    with pytest.raises(TritonStatusError, match='"R" is limited to 5 '):
        limiter.register("on0", group(("R", 8, False)), 0)
    global_limiter = RateLimiter([ResourceLimit("G", 3, 0), ResourceLimit("G", 7, 1)])
    global_limiter.register("g", group(("G", 7, True)), 0)


def test_global_and_device_resource_of_one_name_is_refused():
    limiter = RateLimiter()
    limiter.register("a", group(("R", 1, True)), 0)
    with pytest.raises(TritonStatusError) as caught:
        limiter.register("b", group(("R", 1, False)), 0)
    assert str(caught.value) == (
        'Resource "R" is present as both global and device-specific resource in the model '
        "configuration."
    )


def test_device_resources_do_not_contend_across_devices():
    limiter = RateLimiter()
    on0 = limiter.register("on0", group(("R", 1, False)), 0)
    on1 = limiter.register("on1", group(("R", 1, False)), 1)
    with on0.hold(), on1.hold():  # would wait forever if R were shared
        pass


# -- freed on every way out -----------------------------------------------------------------


def test_released_when_execute_raises():
    limiter = RateLimiter()
    first = limiter.register("a", group(("R", 1, False)), 0)
    with pytest.raises(RuntimeError), first.hold():
        raise RuntimeError("execute failed")
    second = limiter.register("b", group(("R", 1, False)), 0)
    with second.hold():  # R is free again
        pass


def test_unregister_wakes_a_waiter_and_frees_a_holder():
    limiter = RateLimiter()
    holder = limiter.register("holder", group(("R", 1, False)), 0)
    waiter = limiter.register("waiter", group(("R", 1, False)), 0)
    limiter.acquire(holder)
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            limiter.acquire(waiter)
        except Withdrawn as exc:
            outcome.append(exc)

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    wait_until(lambda: limiter.waiting() == 1, "the waiter waits")
    waiter.unregister()
    thread.join(10)
    assert outcome and outcome[0].code == pb_utils.TritonError.UNAVAILABLE
    holder.unregister()  # an abandoned execute: its resource goes with it
    late = limiter.register("late", group(("R", 1, False)), 0)
    with late.hold():
        pass


# -- priority: the order of grants, on real models ------------------------------------------


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LoadedRepository]:
    monkeypatch.setenv("RATE_LIMITER_LOG", str(tmp_path / "log"))
    monkeypatch.setenv("RATE_LIMITER_GATE", str(tmp_path / "gate"))
    loaded = LoadedRepository(rate_limiter=RateLimiter())
    load_repository(
        [materialize(REPO, tmp_path)], only={"gate_hold", "light", "heavy"}, into=loaded
    )
    assert set(loaded.models) == {"gate_hold", "light", "heavy"}, loaded.failures
    yield loaded
    loaded.close()


def infer(loaded: LoadedRepository, model: str) -> None:
    response = loaded.models[model].infer(request(), timeout=30)
    assert not response.has_error(), response.error().message()


def request() -> InferRequest:
    return InferRequest([pb_utils.Tensor("INPUT0", np.array([1], dtype=np.int32))])


def runs_after_gate(loaded: LoadedRepository, tmp_path: Path, queued: list[str]) -> list[str]:
    """Hold R with gate_hold, queue `queued` in that order (each waiting at the limiter before
    the next is sent), open the gate, and return the order in which they ran."""
    log = tmp_path / "log"
    log.write_text("")
    limiter = loaded.rate_limiter
    assert limiter is not None
    done: list[bool] = []

    def respond(response: pb_utils.InferenceResponse | None, final: bool) -> None:
        if final:
            done.append(True)

    loaded.models["gate_hold"].submit(request(), respond)
    wait_until(lambda: log.read_text() == "run gate_hold\n", "gate_hold holds R")
    for count, model in enumerate(queued, start=1):
        loaded.models[model].submit(request(), respond)
        wait_until(lambda count=count: limiter.waiting() == count, f"{model} waits for R")
    (tmp_path / "gate").touch()
    wait_until(lambda: len(done) == len(queued) + 1, "every request answered")
    return [line.split()[1] for line in log.read_text().splitlines()[1:]]


def test_lower_priority_value_first_at_equal_execution_counts(repo, tmp_path):
    """light (priority 1) and heavy (priority 2) ran once each: light's turn counts 1×1, heavy's
    1×2, so light goes first though heavy waited longer."""
    infer(repo, "light")
    infer(repo, "heavy")
    assert runs_after_gate(repo, tmp_path, ["heavy", "light"]) == ["light", "heavy"]


def test_priority_is_a_weight_on_the_execution_count(repo, tmp_path):
    """light ran 3 times (3×1), heavy once (1×2): heavy goes first, though its priority value is
    the larger and it waited less."""
    for _ in range(3):
        infer(repo, "light")
    infer(repo, "heavy")
    assert runs_after_gate(repo, tmp_path, ["light", "heavy"]) == ["heavy", "light"]


def test_without_a_limiter_nothing_waits(tmp_path, monkeypatch):
    """`--rate-limit off` (no limiter): heavy runs while gate_hold holds "R"."""
    monkeypatch.setenv("RATE_LIMITER_LOG", str(tmp_path / "log"))
    monkeypatch.setenv("RATE_LIMITER_GATE", str(tmp_path / "gate"))
    loaded = load_repository([materialize(REPO, tmp_path)], only={"gate_hold", "heavy"})
    try:
        (tmp_path / "log").write_text("")
        loaded.models["gate_hold"].submit(request(), lambda response, final: None)
        wait_until(lambda: "run gate_hold" in (tmp_path / "log").read_text(), "gate_hold runs")
        infer(loaded, "heavy")
        (tmp_path / "gate").touch()
    finally:
        loaded.close()


def test_unload_while_waiting_answers_unavailable_and_frees_the_instance(repo, tmp_path, caplog):
    """A request whose instance still waits for resources when the close's bound is reached is
    answered UNAVAILABLE like any request still running then, and the instance is woken and
    finalized, not abandoned behind the wait."""
    log = tmp_path / "log"
    log.write_text("")
    answers: list[str] = []

    def respond(response: pb_utils.InferenceResponse | None, final: bool) -> None:
        if response is not None and response.has_error():
            answers.append(response.error().message())

    repo.models["gate_hold"].submit(request(), lambda response, final: None)
    wait_until(lambda: log.read_text() == "run gate_hold\n", "gate_hold holds R")
    repo.models["heavy"].submit(request(), respond)
    assert repo.rate_limiter is not None
    wait_until(lambda: repo.rate_limiter.waiting() == 1, "heavy waits for R")
    repo.models["heavy"].close(timeout=2)
    assert not [r for r in caplog.records if "abandoned" in r.getMessage()]
    assert answers == ["Model 'heavy' version 1 is not ready: it is being unloaded"]
    (tmp_path / "gate").touch()
    infer(repo, "light")  # gate_hold's R came back


def test_the_wait_for_resources_is_queue_time(repo, tmp_path):
    """Triton counts a request as queued until its execution starts: heavy's queue time covers
    at least the interval during which the test saw it wait while gate_hold held R (held on
    purpose for a while, so that the bound means something; compute time would hold the wait
    instead if the schedulers did not move it)."""
    log = tmp_path / "log"
    log.write_text("")
    done: list[bool] = []
    repo.models["gate_hold"].submit(request(), lambda response, final: None)
    wait_until(lambda: log.read_text() == "run gate_hold\n", "gate_hold holds R")
    repo.models["heavy"].submit(request(), lambda response, final: done.append(final))
    assert repo.rate_limiter is not None
    wait_until(lambda: repo.rate_limiter.waiting() == 1, "heavy waits for R")
    seen_waiting = time.monotonic_ns()
    time.sleep(0.3)  # the hold, not a wait for an event
    held = time.monotonic_ns() - seen_waiting
    (tmp_path / "gate").touch()
    wait_until(lambda: done == [True], "heavy answered")
    stats = repo.models["heavy"].latest.stats.snapshot()
    assert stats.queue.count == 1
    assert stats.queue.ns >= held


@pytest.mark.parametrize(
    ("scheduling", "kind"),
    [
        ("", "thread"),
        ("dynamic_batching { }", "thread"),
        ("sequence_batching { }", "thread"),
        ("", "process"),
    ],
    ids=["default", "dynamic", "sequence", "isolated"],
)
def test_every_scheduler_runs_under_the_limiter(tmp_path, monkeypatch, scheduling, kind):
    """`heavy` with each of Triton's schedulers, and in a process of its own, waits while
    gate_hold holds R, then runs."""
    monkeypatch.setenv("RATE_LIMITER_LOG", str(tmp_path / "log"))
    monkeypatch.setenv("RATE_LIMITER_GATE", str(tmp_path / "gate"))
    models = tmp_path / "models"
    for name in ("gate_hold", "heavy"):
        materialize_model(REPO, name, models)
    config = models / "heavy" / "config.pbtxt"
    config.write_text(config.read_text() + scheduling + "\n")
    loaded = load_repository(
        [models],
        ConfigOptions(instance_kind=kind),
        into=LoadedRepository(rate_limiter=RateLimiter()),
    )
    assert not loaded.failures, loaded.failures
    try:
        log = tmp_path / "log"
        log.write_text("")
        loaded.models["gate_hold"].submit(request(), lambda response, final: None)
        wait_until(lambda: log.read_text() == "run gate_hold\n", "gate_hold holds R")
        answers: list[pb_utils.InferenceResponse] = []
        params: dict = {"sequence_id": 7, "sequence_start": True, "sequence_end": True}
        heavy = InferRequest(
            [pb_utils.Tensor("INPUT0", np.array([1], dtype=np.int32))],
            parameters=params if scheduling.startswith("sequence") else {},
        )
        loaded.models["heavy"].submit(heavy, lambda response, final: answers.append(response))
        assert loaded.rate_limiter is not None
        wait_until(lambda: loaded.rate_limiter.waiting() == 1, "heavy waits for R")
        assert log.read_text() == "run gate_hold\n"
        (tmp_path / "gate").touch()
        wait_until(lambda: answers, "heavy answered")
        assert not answers[0].has_error(), answers[0].error().message()
        assert log.read_text() == "run gate_hold\nrun heavy\n"
    finally:
        loaded.close()


def test_a_crashed_isolated_instance_frees_its_resources(tmp_path, monkeypatch):
    """heavy's process dies inside execute (holding R): its request fails, and light, which
    needs the same R, still runs."""
    monkeypatch.setenv("RATE_LIMITER_LOG", str(tmp_path / "log"))
    models = tmp_path / "models"
    for name in ("heavy", "light"):
        materialize_model(REPO, name, models)
    model_file = models / "heavy" / "1" / "model.py"
    model_file.write_text(
        model_file.read_text().replace(
            "    def execute(self, requests):\n",
            "    def execute(self, requests):\n        os._exit(3)\n",
        )
    )
    loaded = load_repository(
        [models],
        ConfigOptions(instance_kind="process"),
        into=LoadedRepository(rate_limiter=RateLimiter()),
    )
    assert not loaded.failures, loaded.failures
    try:
        crashed = loaded.models["heavy"].infer(request(), timeout=30)
        assert crashed.has_error()
        infer(loaded, "light")
    finally:
        loaded.close()


def test_warmup_runs_under_the_limiter(tmp_path, monkeypatch):
    """As Triton sends warmup samples through its rate limiter, heavy's warmup (and so its
    load) waits while gate_hold holds R."""
    monkeypatch.setenv("RATE_LIMITER_LOG", str(tmp_path / "log"))
    monkeypatch.setenv("RATE_LIMITER_GATE", str(tmp_path / "gate"))
    models = tmp_path / "models"
    for name in ("gate_hold", "heavy"):
        materialize_model(REPO, name, models)
    config = models / "heavy" / "config.pbtxt"
    config.write_text(
        config.read_text()
        + 'model_warmup [ { name: "w" batch_size: 1 inputs { key: "INPUT0" value: '
        "{ data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } } } ]\n"
    )
    log = tmp_path / "log"
    log.write_text("")
    loaded = LoadedRepository(rate_limiter=RateLimiter())
    load_repository([models], only={"gate_hold"}, into=loaded)
    try:
        loaded.models["gate_hold"].submit(request(), lambda response, final: None)
        wait_until(lambda: log.read_text() == "run gate_hold\n", "gate_hold holds R")
        loading = threading.Thread(
            target=load_repository, args=([models],), kwargs={"only": {"heavy"}, "into": loaded}
        )
        loading.start()
        assert loaded.rate_limiter is not None
        wait_until(lambda: loaded.rate_limiter.waiting() == 1, "heavy's warmup waits for R")
        assert "heavy" not in loaded.models
        (tmp_path / "gate").touch()
        loading.join(30)
        assert loaded.statuses["heavy"].ready, loaded.failures
        assert log.read_text() == "run gate_hold\nrun heavy\n"
    finally:
        loaded.close()


def test_a_request_cancelled_while_waiting_never_executes_and_frees_r(repo, tmp_path):
    """heavy's request is cancelled while its instance waits for R: once R comes, the request
    is answered CANCELLED without `execute` (as any request cancelled before execute), and R is
    free again for light."""
    log = tmp_path / "log"
    log.write_text("")
    answers: list[pb_utils.InferenceResponse] = []
    repo.models["gate_hold"].submit(request(), lambda response, final: None)
    wait_until(lambda: log.read_text() == "run gate_hold\n", "gate_hold holds R")
    pending = repo.models["heavy"].submit(request(), lambda r, final: answers.append(r))
    assert pending is not None and repo.rate_limiter is not None
    wait_until(lambda: repo.rate_limiter.waiting() == 1, "heavy waits for R")
    pending.cancel()
    (tmp_path / "gate").touch()
    wait_until(lambda: answers, "heavy answered")
    assert answers[0].error().code() == pb_utils.TritonError.CANCELLED
    infer(repo, "light")
    assert log.read_text() == "run gate_hold\nrun light\n"
