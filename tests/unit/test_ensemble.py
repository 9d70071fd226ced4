"""Ensembles in-process (tests/repositories/composition, ensemble_stream): loading, dataflow,
errors, streaming.

Expected values and texts are Triton 2.51's for the same repository
(tests/repositories/composition/README.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_repository_loader import pb_utils
from model_repository_loader.composition import EnsembleModel, Scope, load_order
from model_repository_loader.inference import InferRequest
from model_repository_loader.loader import LoadedRepository, load_repository
from model_repository_loader.repository import scan

REPO = Path(__file__).resolve().parents[2] / "tests" / "repositories" / "composition"
STREAM_REPO = REPO.parent / "ensemble_stream"
F = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)


@pytest.fixture(scope="module")
def repo() -> Iterator[LoadedRepository]:
    loaded = load_repository([REPO])
    yield loaded
    loaded.close()


def infer(repo: LoadedRepository, model: str, inputs: dict[str, np.ndarray], **kw: Any) -> Any:
    tensors = [pb_utils.Tensor(name, array) for name, array in inputs.items()]
    response = repo.models[model].infer(InferRequest(tensors, **kw), timeout=20)
    if response.has_error():
        return response.error()
    return {t.name(): t.as_numpy().tolist() for t in response.output_tensors()}


def flagged_stream(
    repo: LoadedRepository, model: str, inputs: dict[str, np.ndarray]
) -> list[tuple[Any, bool]]:
    """Every `respond` call of one request: (its outputs, its error text, or None for a
    flag-only one; its final flag)."""
    got: list[tuple[Any, bool]] = []
    done: list[bool] = []

    def respond(response: pb_utils.InferenceResponse | None, final: bool) -> None:
        shown: Any = None
        if response is not None:
            error = response.error()
            shown = (
                error.message()
                if error is not None
                else {t.name(): t.as_numpy().tolist() for t in response.output_tensors()}
            )
        got.append((shown, final))
        if final:
            done.append(True)

    tensors = [pb_utils.Tensor(name, array) for name, array in inputs.items()]
    repo.models[model].submit(InferRequest(tensors), respond)
    deadline = time.monotonic() + 20
    while not done and time.monotonic() < deadline:
        time.sleep(0.01)
    assert done, "no final response"
    return got


def stream(repo: LoadedRepository, model: str, inputs: dict[str, np.ndarray]) -> list[Any]:
    """The responses of one request, flag-only ones left out."""
    return [shown for shown, _ in flagged_stream(repo, model, inputs) if shown is not None]


# -- loading ----------------------------------------------------------------------------------

# Triton 2.51's reasons for the ensembles of the repository that must fail [V].
LOAD_FAILURES = {
    "bad_missing_step": "ensemble bad_missing_step contains models that are not available or "
    "ambiguous: no_such_model",
    "bad_self": "circular dependency between ensembles: bad_self -> ... -> bad_self -> bad_self",
    "cycle_a": "circular dependency between ensembles: cycle_a -> ... -> cycle_b -> cycle_a",
    "cycle_b": "circular dependency between ensembles: cycle_b -> ... -> cycle_a -> cycle_b",
    "bad_dtype": "in ensemble bad_dtype, ensemble tensor X: inconsistent data type: TYPE_INT32 "
    "is inferred from model bad_dtype while TYPE_FP32 is inferred from model slow",
    "bad_input_key": "in ensemble bad_input_key, ensemble tensor X is mapping to non-existing "
    "input NOPE in model slow",
    "bad_output_key": "in ensemble bad_output_key, ensemble tensor Y is mapped from "
    "non-existing output NOPE in model slow",
    "bad_shape": "in ensemble bad_shape, ensemble tensor X: inconsistent shape: [3] is inferred "
    "from model bad_shape while [4] is inferred from model slow",
    "bad_version": "ensemble 'bad_version' depends on 'slow' whose required version 7 is not "
    "loaded.",
    "bad_on_failed": "ensemble 'bad_on_failed' depends on 'bad_missing_step' which is not "
    "valid. Model 'bad_missing_step' failed with error: ensemble bad_missing_step contains "
    "models that are not available or ambiguous: no_such_model",
}


def test_load_failures_have_tritons_reasons(repo):
    assert repo.failures == LOAD_FAILURES


def test_ensembles_load_after_their_steps():
    ordered, failures = load_order(scan([REPO]))
    names = [s.name for s in ordered]
    assert names.index("nested") > names.index("pipeline") > names.index("multiply")
    assert set(failures) == {"bad_missing_step", "bad_self", "cycle_a", "cycle_b"}


def test_ensemble_is_served_like_a_model(repo):
    model = repo.models["pipeline"]
    assert isinstance(model, EnsembleModel)
    assert model.name == "pipeline" and list(model.versions) == [1]
    assert repo.statuses["pipeline"].ready and repo.statuses["pipeline"].versions == [1]


def test_transaction_policy_follows_the_steps(repo):
    # Triton's ModelConfig: `model_transaction_policy {}` / `{decoupled: true}` [V].
    assert repo.models["pipeline"].config.HasField("model_transaction_policy")
    assert not repo.models["pipeline"].config.model_transaction_policy.decoupled
    assert repo.models["streaming"].config.model_transaction_policy.decoupled


# -- inference --------------------------------------------------------------------------------


def test_three_step_pipeline(repo):
    assert infer(repo, "pipeline", {"RAW": F}) == {
        "RESULT": [3.0, 15.0, 35.0, 63.0],
        "SUM": [3.0, 5.0, 7.0, 9.0],
    }


def test_ensemble_inside_an_ensemble(repo):
    assert infer(repo, "nested", {"X": F}) == {"Z": [6.0, 30.0, 70.0, 126.0]}


def test_step_model_version(repo):
    assert infer(repo, "versioned_ens", {"X": F}) == {"Y": [1.0, 2.0, 3.0, 4.0]}


def test_independent_steps_run_in_parallel(repo, tmp_path):
    # `slow` and `slow_b` each wait inside execute for the other: one after the other, the first
    # would wait in vain and answer an error.
    result = infer(repo, "parallel", {"X": F}, parameters={"meet": str(tmp_path)})
    assert result == {"A": F.tolist(), "B": F.tolist()}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["slow", "slow_b"]


def test_requested_output_that_prunes_another_output_fails_as_in_triton(repo):
    error = infer(repo, "pipeline", {"RAW": F}, requested_outputs=["SUM"])
    assert error.message() == (
        "in ensemble 'pipeline', [request id: <id_unknown>] unexpected deadlock, at least one "
        "output is not set while no more ensemble steps can be made"
    )
    assert error.code() == pb_utils.TritonError.INVALID_ARG


def test_requested_output_subset(repo):
    assert infer(repo, "pipeline", {"RAW": F}, requested_outputs=["RESULT"]) == {
        "RESULT": [3.0, 15.0, 35.0, 63.0]
    }


@pytest.mark.parametrize(
    ("inputs", "text"),
    [
        ({"X": F}, "unexpected inference input 'X' for model 'pipeline'"),
        (
            {"RAW": F[:3]},
            "[request id: <id_unknown>] unexpected shape for input 'RAW' for model 'pipeline'. "
            "Expected [4], got [3]. ",
        ),
        (
            {"RAW": F.astype(np.int32)},
            "[request id: <id_unknown>] inference input 'RAW' data-type is 'INT32', but model "
            "'pipeline' expects 'FP32'",
        ),
    ],
)
def test_request_checks_use_the_ensemble_name(repo, inputs, text):
    error = infer(repo, "pipeline", inputs)
    assert error.message() == text
    assert error.code() == pb_utils.TritonError.INVALID_ARG


def test_step_error_names_the_ensemble(repo):
    error = infer(repo, "raising_ens", {"X": F})
    assert error.message().startswith(
        "in ensemble 'raising_ens', Failed to process the request(s) for model 'raiser_0_0', "
        "message: ValueError: raiser refuses\n\nAt:\n"
    )
    assert error.code() == pb_utils.TritonError.INTERNAL


def test_decoupled_step_streams_through(repo):
    assert stream(repo, "streaming", {"COUNT": np.array([2], dtype=np.int32)}) == [
        {"F": [0.0]},
        {"F": [1.5]},
    ]


def test_final_flag_rides_on_the_response_made_last():
    # Triton sends FINAL with the response made once no step is in flight: here the producer's
    # flag-only FINAL comes before the slow consumer's last answer [core FinishEnsemble].
    loaded = load_repository([STREAM_REPO])
    try:
        count = np.array([[3]], dtype=np.int32)
        answers = flagged_stream(loaded, "decoupled_first", {"IN": count})
    finally:
        loaded.close()
    assert answers == [({"OUT": [[0.5]]}, False)] * 2 + [({"OUT": [[0.5]]}, True)]


def test_decoupled_ensemble_with_no_responses(repo):
    assert stream(repo, "streaming", {"COUNT": np.array([0], dtype=np.int32)}) == []


def test_decoupled_step_error_ends_the_stream(repo):
    assert stream(repo, "streaming", {"COUNT": np.array([-1], dtype=np.int32)}) == [
        "in ensemble 'streaming', repeat_dec got a negative count"
    ]


def test_steps_are_looked_up_live(repo):
    ensemble = repo.models["versioned_ens"]
    models = {"versioned": repo.models["versioned"]}
    own = EnsembleModel("versioned_ens", 1, ensemble.config, Scope(models))
    tensor = pb_utils.Tensor("X", F)
    assert not own.infer(InferRequest([tensor]), timeout=10).has_error()
    del models["versioned"]  # unloaded meanwhile
    error = own.infer(InferRequest([tensor]), timeout=10).error()
    assert error.message() == (
        "in ensemble 'versioned_ens', Request for unknown model: 'versioned' is not found"
    )


IDENTITY = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]
            )
            for r in requests
        ]
"""


def test_tensors_gain_and_lose_a_batch_dimension_between_batching_and_other_steps(tmp_path):
    """Triton's ReshapeTensorDims (qa/L0_simple_ensemble's max_queue_size ensembles): a
    non-batching ensemble's [1] reaches a batching step (max_batch_size 1, dims [1]) as [1, 1],
    and that step's batch of 1 reaches a non-batching step (dims [1]) and the ensemble's
    output as [1] again."""
    io = 'input [{{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }}]\n' + (
        'output [{{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }}]\n'
    )
    for name, batch in (("batching", 1), ("flat", 0)):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "model.py").write_text(IDENTITY)
        (tmp_path / name / "config.pbtxt").write_text(
            f'backend: "python"\nmax_batch_size: {batch}\n' + io.format()
        )
    (tmp_path / "ens" / "1").mkdir(parents=True)
    (tmp_path / "ens" / "config.pbtxt").write_text(
        'platform: "ensemble"\nmax_batch_size: 0\n' + io.format() + "ensemble_scheduling { step [\n"
        '  { model_name: "batching" model_version: -1 input_map { key: "IN" value: "IN" }'
        ' output_map { key: "OUT" value: "mid" } },\n'
        '  { model_name: "flat" model_version: -1 input_map { key: "IN" value: "mid" }'
        ' output_map { key: "OUT" value: "OUT" } } ] }\n'
    )
    loaded = load_repository([tmp_path])
    try:
        assert loaded.failures == {}
        value = np.array([0.5], dtype=np.float32)
        response = loaded.models["ens"].infer(InferRequest([pb_utils.Tensor("IN", value)]), 20)
        assert response.error() is None
        assert response.output_tensors()[0].as_numpy().tolist() == [0.5]
    finally:
        loaded.close()


# -- max_inflight_requests (Triton 2.63 on; qa/L0_simple_ensemble EnsembleBackpressureTest) ----


class _Run:
    cancelled = False


def test_step_limiter_queues_what_cannot_wait_and_frees_it_in_order():
    from model_repository_loader.composition.ensemble import StepLimiter

    limiter = StepLimiter(1, "e", 1)
    run, sent = _Run(), []
    assert limiter.acquire_or_defer(run, lambda: sent.append("a"))  # type: ignore[arg-type]
    assert not limiter.acquire_or_defer(run, lambda: sent.append("b"))  # type: ignore[arg-type]
    assert not limiter.acquire_or_defer(run, lambda: sent.append("c"))  # type: ignore[arg-type]
    limiter.release()  # a's slot goes to b, which is sent on this thread
    assert sent == ["b"]
    limiter.cancelled(run)  # a cancelled request waits for nothing
    assert sent == ["b", "c"]


def test_step_limiter_wait_is_bounded(caplog):
    from model_repository_loader.composition.ensemble import StepLimiter

    limiter = StepLimiter(1, "e", 2)
    limiter.acquire(lambda: False)
    started = time.monotonic()
    limiter.acquire(lambda: False, timeout=0.2)  # goes ahead past the bound, as Triton does
    assert time.monotonic() - started >= 0.2
    assert (
        "[Internal Error] Ensemble 'e' unable to schedule step 2 (inflight: 1 >= limit: 1) for 0 "
        "seconds. Proceeding to avoid deadlock." in caplog.text
    )


PRODUCER = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for _ in range(6):
                out = pb_utils.Tensor("OUT", np.array([0.5], dtype=np.float32))
                sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
CONSUMER = """import json
import os
import logging
import threading
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            folder = json.loads(request.parameters())["spans"]
            start = time.monotonic()
            time.sleep(0.1)
            with open(os.path.join(folder, f"{start}-{time.monotonic()}"), "w"):
                pass
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data)]))
        return responses
"""


@pytest.mark.parametrize("limit", [0, 1])
def test_max_inflight_requests_bounds_a_steps_requests(tmp_path, caplog, limit):
    """A decoupled producer's six responses each run a consumer with two instances: with
    `max_inflight_requests: 1` one at a time (the producer's send() waits), without it side by
    side. Every response arrives, the last with FINAL."""
    io = (
        'input [{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }]\n'
        'output [{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }]\n'
    )
    models = tmp_path / "models"
    for name, code, extra in (
        ("producer", PRODUCER, "model_transaction_policy { decoupled: true }\n"),
        (
            "consumer",
            CONSUMER,
            "instance_group [{ count: 2 kind: KIND_CPU }]\n"
            'parameters { key: "BRIDGE_INSTANCE_KIND" value { string_value: "thread" } }\n',
        ),
    ):
        (models / name / "1").mkdir(parents=True)
        (models / name / "1" / "model.py").write_text(code)
        (models / name / "config.pbtxt").write_text(f'backend: "python"\n{io}{extra}')
    (models / "ens" / "1").mkdir(parents=True)
    setting = f"max_inflight_requests: {limit}\n" if limit else ""
    (models / "ens" / "config.pbtxt").write_text(
        f'platform: "ensemble"\n{io}ensemble_scheduling {{ {setting} step [\n'
        '  { model_name: "producer" model_version: -1 input_map { key: "IN" value: "IN" }'
        ' output_map { key: "OUT" value: "mid" } },\n'
        '  { model_name: "consumer" model_version: -1 input_map { key: "IN" value: "mid" }'
        ' output_map { key: "OUT" value: "OUT" } } ] }\n'
    )
    spans = tmp_path / "spans"
    spans.mkdir()
    with caplog.at_level(logging.INFO):
        loaded = load_repository([models])
    try:
        assert loaded.failures == {}
        configured = "Ensemble model 'ens' configured with max_inflight_requests: 1"
        assert (configured in caplog.text) == (limit == 1)
        got: list[tuple[Any, bool]] = []
        done = threading.Event()

        def respond(response: pb_utils.InferenceResponse | None, final: bool) -> None:
            outputs = None if response is None else len(response.output_tensors())
            got.append((outputs, final))
            if final:
                done.set()

        request = InferRequest(
            [pb_utils.Tensor("IN", np.array([1], dtype=np.float32))],
            parameters={"spans": str(spans)},
        )
        loaded.models["ens"].submit(request, respond)
        assert done.wait(20)
        assert [outputs for outputs, _ in got if outputs] == [1] * 6
        assert got[-1][1] and not any(final for _, final in got[:-1])
        intervals = sorted(tuple(map(float, p.name.split("-"))) for p in spans.iterdir())
        overlaps = any(b[0] < a[1] for a, b in zip(intervals, intervals[1:], strict=False))
        assert overlaps == (limit == 0)
    finally:
        loaded.close()
