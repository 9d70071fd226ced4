"""The in-process loader API: load_repository() and Model.infer(), no server involved.

Models are the e2e repositories (tests/repositories/e2e_*); expected texts are Triton's
(spec §2.1-§2.4, §3.4, tests/repositories/load_failures/README.md).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from model_repository_loader import pb_utils
from model_repository_loader.config import ConfigOptions
from model_repository_loader.inference import InferRequest
from model_repository_loader.loader import LoadedRepository, load_repository
from model_repository_loader.pb_utils.logger import LOGGER_NAME

ROOT = Path(__file__).resolve().parents[2]
REPOSITORIES = ROOT / "tests" / "repositories"
SERVING = REPOSITORIES / "e2e_serving"
CHATTY = SERVING / "chatty" / "1" / "model.py"
WAIT_S = 30.0


@pytest.fixture(scope="module")
def serving() -> Iterator[LoadedRepository]:
    repo = load_repository([SERVING])
    yield repo
    repo.close()


def fp32(values: list[float], name: str = "INPUT0") -> pb_utils.Tensor:
    return pb_utils.Tensor(name, np.array(values, dtype=np.float32))


def int32(values: list[int], name: str = "INPUT0") -> pb_utils.Tensor:
    return pb_utils.Tensor(name, np.array(values, dtype=np.int32))


def outputs(response: pb_utils.InferenceResponse) -> dict[str, np.ndarray]:
    assert not response.has_error(), response.error().message()
    return {t.name(): t.as_numpy() for t in response.output_tensors()}


def wait_for(predicate, what: str) -> None:
    """Bounded poll; fails the test after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def line_of(model_file: Path, text: str) -> int:
    hits = [n for n, line in enumerate(model_file.read_text().splitlines(), 1) if text in line]
    assert len(hits) == 1, hits
    return hits[0]


# -- loading --------------------------------------------------------------------------------------


def test_every_model_loads(serving: LoadedRepository) -> None:
    assert sorted(serving.models) == ["chatty", "echo", "flaky", "pool", "reply_params"]
    assert serving.failures == {}
    for status in serving.statuses.values():
        assert (status.ready, status.versions, status.state) == (True, [1], "READY")


def test_failed_models_are_reported_and_the_rest_load(e2e_load_failures: Path) -> None:
    repo = load_repository([e2e_load_failures])
    try:
        assert sorted(repo.models) == ["healthy"]
        failures = repo.failures
        assert sorted(failures) == ["bad_config", "init_raises", "syntax_error"]
        # Triton 2.51 (seen on this repository): the import fails in auto-complete.
        assert failures["syntax_error"] == "Internal: SyntaxError: expected ':' (model.py, line 4)"
        init_file = e2e_load_failures / "init_raises" / "1" / "model.py"
        assert failures["init_raises"] == (
            "Internal: RuntimeError: e2e init_raises refuses to start\n\n"
            f"At:\n  {init_file}(6): initialize\n"
        )
        bad = e2e_load_failures / "bad_config" / "config.pbtxt"
        assert failures["bad_config"] == f"failed to read text proto from {bad}"
        assert repo.statuses["init_raises"].state == "UNAVAILABLE"
        response = repo.models["healthy"].infer(InferRequest([int32([4])]), timeout=WAIT_S)
        assert outputs(response)["OUTPUT0"].tolist() == [4]
    finally:
        repo.close()


def test_only_loads_the_named_models(e2e_load_failures: Path) -> None:
    repo = load_repository([e2e_load_failures], only=["healthy"])
    try:
        assert sorted(repo.statuses) == ["healthy"]
        assert repo.failures == {}
    finally:
        repo.close()


def test_duplicate_name_across_repositories_fails_that_model_only(
    e2e_multi_a: Path, e2e_multi_b: Path
) -> None:
    repo = load_repository([e2e_multi_a, e2e_multi_b])
    try:
        assert sorted(repo.models) == ["alpha", "beta"]
        assert repo.failures["common"] == (
            "failed to poll model 'common': not unique across all model repositories"
        )
    finally:
        repo.close()


def test_auto_complete_off_requires_a_config(e2e_no_config: Path) -> None:
    repo = load_repository([e2e_no_config], ConfigOptions(auto_complete=False))
    try:
        assert sorted(repo.models) == ["configured"]
        missing = e2e_no_config / "unconfigured" / "config.pbtxt"
        assert repo.failures["unconfigured"] == (
            f"failed to open text file for read {missing}: No such file or directory"
        )
    finally:
        repo.close()


def test_auto_complete_on_fills_the_config(e2e_no_config: Path) -> None:
    repo = load_repository([e2e_no_config], only=["unconfigured"])
    try:
        model = repo.models["unconfigured"]
        assert [i.name for i in model.config.input] == ["INPUT0"]
        response = model.infer(InferRequest([int32([9])]), timeout=WAIT_S)
        assert outputs(response)["OUTPUT0"].tolist() == [9]
    finally:
        repo.close()


def test_missing_repository_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_repository([tmp_path / "nowhere"])


# -- Model.infer ----------------------------------------------------------------------------------


def test_infer_returns_every_output(serving: LoadedRepository) -> None:
    response = serving.models["echo"].infer(InferRequest([fp32([1.5, -2.0])]), timeout=WAIT_S)
    got = outputs(response)
    assert sorted(got) == ["OUTPUT0", "PARAMS", "REQUEST_ID", "TEXT"]
    np.testing.assert_array_equal(got["OUTPUT0"], np.array([1.5, -2.0], np.float32))
    assert got["TEXT"].tolist() == [b"1.5", b"-2"]


def test_infer_passes_parameters_and_request_id(serving: LoadedRepository) -> None:
    sent = {"flag": True, "count": 3, "name": "x", "ratio": 0.25}
    # Reserved parameters are Triton's own and never reach parameters().
    request = InferRequest(
        [fp32([1.0])], request_id="rid-9", parameters={**sent, "priority": 1, "timeout": 5}
    )
    got = outputs(serving.models["echo"].infer(request, timeout=WAIT_S))
    assert json.loads(got["PARAMS"][0]) == sent
    assert got["REQUEST_ID"].tolist() == [b"rid-9"]


def test_infer_keeps_only_requested_outputs(serving: LoadedRepository) -> None:
    request = InferRequest([fp32([1.0])], requested_outputs=["TEXT"])
    got = outputs(serving.models["echo"].infer(request, timeout=WAIT_S))
    assert sorted(got) == ["TEXT"]


def test_infer_validates_the_request(serving: LoadedRepository) -> None:
    request = InferRequest([fp32([1.0], name="WRONG")], request_id="v1")
    response = serving.models["echo"].infer(request, timeout=WAIT_S)
    assert response.has_error()
    assert response.error().code() == pb_utils.TritonError.INVALID_ARG
    assert "WRONG" in response.error().message()


def test_infer_unknown_version(serving: LoadedRepository) -> None:
    request = InferRequest([fp32([1.0])], model_version=7)
    response = serving.models["echo"].infer(request, timeout=WAIT_S)
    assert response.error().code() == pb_utils.TritonError.NOT_FOUND
    assert response.error().message() == "Request for unknown model: 'echo' version 7 is not found"


def test_exception_in_execute_is_an_error_response(serving: LoadedRepository) -> None:
    model = serving.models["flaky"]
    response = model.infer(InferRequest([fp32([-1.0])]), timeout=WAIT_S)
    assert response.has_error()
    flaky_file = SERVING / "flaky" / "1" / "model.py"
    assert response.error().message() == (
        "Failed to process the request(s) for model 'flaky_0', message: "
        "ValueError: flaky refuses negative values: [-1.0]\n\n"
        f"At:\n  {flaky_file}(8): check\n  {flaky_file}(16): execute\n"
    )
    # The instance is still usable.
    assert outputs(model.infer(InferRequest([fp32([2.0])]), timeout=WAIT_S))["OUTPUT0"] == [2.0]


def test_two_instances_run_at_once(serving: LoadedRepository, tmp_path: Path) -> None:
    # Each held request occupies one instance; both start only if both instances serve.
    gate = tmp_path / "gate"
    model = serving.models["pool"]
    results: dict[str, pb_utils.InferenceResponse] = {}

    def call(tag: str) -> None:
        params = {"started": str(tmp_path / f"started-{tag}"), "gate": str(gate)}
        results[tag] = model.infer(InferRequest([fp32([1.0])], parameters=params), WAIT_S)

    threads = [threading.Thread(target=call, args=(tag,)) for tag in ("a", "b")]
    for thread in threads:
        thread.start()
    try:
        started = [tmp_path / "started-a", tmp_path / "started-b"]
        wait_for(lambda: all(p.exists() for p in started), "both requests to start")
        assert {p.read_text() for p in started} == {"pool_0_0", "pool_0_1"}
    finally:
        gate.write_text("open")
        for thread in threads:
            thread.join(WAIT_S)
    assert {outputs(r)["INSTANCE"][0] for r in results.values()} == {b"pool_0_0", b"pool_0_1"}


def test_infer_timeout(serving: LoadedRepository, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    request = InferRequest([fp32([1.0])], parameters={"gate": str(gate)})
    try:
        with pytest.raises(TimeoutError, match="did not answer"):
            serving.models["pool"].infer(request, timeout=0.05)
    finally:
        gate.write_text("open")  # let the held request finish


# -- logging and finalize -------------------------------------------------------------------------


def test_logger_records_carry_model_file_and_line(
    serving: LoadedRepository, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger=LOGGER_NAME):
        serving.models["chatty"].infer(InferRequest([fp32([1.0])], request_id="c1"), WAIT_S)
    records = {r.getMessage(): r for r in caplog.records if r.name == LOGGER_NAME}
    expected = {
        "chatty-execute-info id=c1": (logging.INFO, '"chatty-execute-info'),
        "chatty-execute-warn": (logging.WARNING, '"chatty-execute-warn"'),
        "chatty-execute-error": (logging.ERROR, '"chatty-execute-error"'),
        "chatty-execute-verbose": (logging.DEBUG, '"chatty-execute-verbose"'),
        "chatty-execute-log-verbose": (logging.DEBUG, '"chatty-execute-log-verbose"'),
    }
    for message, (level, marker) in expected.items():
        record = records[message]
        assert (record.levelno, record.filename, record.lineno) == (
            level,
            "model.py",
            line_of(CHATTY, marker),
        )


def test_close_runs_every_finalize(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("E2E_MARKER_DIR", str(tmp_path))
    repo = load_repository([SERVING], only=["echo", "pool"])
    assert list(tmp_path.iterdir()) == []
    repo.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "echo_0.finalized",
        "pool_0_0.finalized",
        "pool_0_1.finalized",
    ]


def test_close_waits_for_requests_in_flight(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv("E2E_MARKER_DIR", str(markers))
    repo = load_repository([SERVING], only=["pool"])
    gate, started = tmp_path / "gate", tmp_path / "started"
    result: list[pb_utils.InferenceResponse] = []
    request = InferRequest([fp32([3.0])], parameters={"gate": str(gate), "started": str(started)})
    worker = threading.Thread(target=lambda: result.append(repo.models["pool"].infer(request)))
    worker.start()
    wait_for(started.exists, "the request to start")
    closer = threading.Thread(target=repo.close)
    closer.start()
    closer.join(0.2)  # close() must still be waiting: the request is held
    assert closer.is_alive() and not result
    gate.write_text("open")
    closer.join(WAIT_S)
    worker.join(WAIT_S)
    assert outputs(result[0])["OUTPUT0"].tolist() == [3.0]
    assert len(list(markers.iterdir())) == 2


def test_readme_example_runs() -> None:
    repo = load_repository([ROOT / "examples" / "model_repository"], only=["add_sub"])
    try:
        x = np.ones((1, 4), np.float32)
        response = repo.models["add_sub"].infer(
            InferRequest(inputs=[pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", x)]),
            timeout=WAIT_S,
        )
        got = outputs(response)
        np.testing.assert_array_equal(got["OUTPUT0"], x + x)
        np.testing.assert_array_equal(got["OUTPUT1"], x - x)
    finally:
        repo.close()


@pytest.mark.parametrize(
    ("config", "kind"),
    [
        ('platform: "tensorrt_plan"', "backend 'tensorrt', platform 'tensorrt_plan'"),
        ('backend: "onnxruntime"', "backend 'onnxruntime', platform 'onnxruntime_onnx'"),
    ],
)
def test_a_model_of_another_backend_says_it_is_not_served(
    tmp_path: Path, config: str, kind: str
) -> None:
    """Issue 24: such a model was reported as "Python model file not found in '.../model.plan'"."""
    model = tmp_path / "other"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.plan").write_bytes(b"\0")
    (model / "config.pbtxt").write_text(
        f'{config}\nmax_batch_size: 0\n'
        'input [{ name: "I" data_type: TYPE_FP32 dims: [ 1 ] }]\n'
        'output [{ name: "O" data_type: TYPE_FP32 dims: [ 1 ] }]\n'
    )
    repo = load_repository([tmp_path])
    try:
        assert repo.failures == {
            "other": "not served: this server runs Python-backend models (and ensembles of "
            f"them); 'other' is a model of {kind}"
        }
    finally:
        repo.close()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        # qa/L0_simple_ensemble/test.sh greps the server log for these three (Triton 2.71).
        ("-5", "3:26: Expected integer, got: -"),
        ('"invalid_value"', '3:26: Expected integer, got: "invalid_value"'),
        ("12345678901", "3:26: Integer out of range (12345678901)"),
        ("1.5", "3:26: Expected integer, got: 1.5"),
    ],
)
def test_a_config_syntax_error_is_logged_as_tritons_parser_words_it(
    caplog: pytest.LogCaptureFixture, value: str, message: str
) -> None:
    from model_repository_loader.config.errors import ConfigError
    from model_repository_loader.config.parse import parse_config_text

    text = f'name: "x"\nensemble_scheduling {{\n  max_inflight_requests: {value}\n}}\n'
    with caplog.at_level(logging.ERROR), pytest.raises(ConfigError) as raised:
        parse_config_text(text, "/m/x/config.pbtxt")
    assert str(raised.value) == "failed to read text proto from /m/x/config.pbtxt"
    expected = f"Error parsing text-format inference.ModelConfig: {message}"
    assert raised.value.detail == expected
    assert expected in caplog.text
