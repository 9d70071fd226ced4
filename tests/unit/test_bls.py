"""BLS in-process (tests/repositories/composition): `exec`, `async_exec`, decoupled iteration.

The `bls` / `bls_async` probe models run the BLS call described by a JSON spec and answer what
they got. Expected values and texts are what Triton 2.51 answered to the same probe
(tests/repositories/composition/README.md).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_repository_loader import pb_utils
from model_repository_loader.composition import BlsExecutor, Scope
from model_repository_loader.inference import InferRequest
from model_repository_loader.loader import LoadedRepository, load_repository

REPO = Path(__file__).resolve().parents[2] / "tests" / "repositories" / "composition"
MODELS = [
    "add_sub",
    "versioned",
    "raiser",
    "repeat_dec",
    "echo_request",
    "slow",
    "bls",
    "bls_async",
    "recurse",
    "ping",
    "pong",
    "scale",
    "multiply",
    "to_float",
    "pipeline",
    "streaming",
]
F = [1.0, 2.0, 3.0, 4.0]
ADD_SUB_INPUTS = [["INPUT0", "FP32", F], ["INPUT1", "FP32", F]]
PREFIX = "Model {} - Error when running inference: "


@pytest.fixture(scope="module")
def repo() -> Iterator[LoadedRepository]:
    loaded = load_repository([REPO], only=MODELS)
    assert not loaded.failures, loaded.failures
    yield loaded
    loaded.close()


def probe(repo: LoadedRepository, spec: dict[str, Any], model: str = "bls") -> Any:
    spec_tensor = pb_utils.Tensor("SPEC", np.array([json.dumps(spec).encode()], dtype=object))
    response = repo.models[model].infer(InferRequest([spec_tensor]), timeout=30)
    assert not response.has_error(), response.error().message()
    return json.loads(response.output_tensors()[0].as_numpy()[0])


def one(result: Any) -> dict[str, Any]:
    assert len(result["responses"]) == 1, result
    return result["responses"][0]


def fp32(values: list[float]) -> list[Any]:
    return ["float32", [len(values)], values]


@pytest.fixture(params=["bls", "bls_async"])
def caller(request: pytest.FixtureRequest) -> str:
    return request.param


def test_exec_returns_requested_outputs(repo, caller):
    spec = {"model": "add_sub", "inputs": ADD_SUB_INPUTS, "outputs": ["OUTPUT0"]}
    assert one(probe(repo, spec, caller)) == {
        "error": None,
        "outputs": {"OUTPUT0": fp32([2.0, 4.0, 6.0, 8.0])},
    }


def test_no_requested_outputs_means_all(repo, caller):
    got = one(probe(repo, {"model": "add_sub", "inputs": ADD_SUB_INPUTS}, caller))
    assert got["outputs"] == {
        "OUTPUT0": fp32([2.0, 4.0, 6.0, 8.0]),
        "OUTPUT1": fp32([0.0, 0.0, 0.0, 0.0]),
    }


@pytest.mark.parametrize(("version", "factor"), [(1, 1.0), (2, 2.0), (-1, 2.0)])
def test_model_version(repo, version, factor):
    spec = {"model": "versioned", "model_version": version, "inputs": [["INPUT0", "FP32", F]]}
    assert one(probe(repo, spec))["outputs"] == {"OUTPUT0": fp32([v * factor for v in F])}


# (spec, Triton 2.51's error text) — every BLS error has code INTERNAL (1) in 2.51 [V].
ERRORS = {
    "unknown_model": (
        {"model": "nope", "inputs": [["INPUT0", "FP32", F]]},
        PREFIX.format("nope")
        + "Failed for execute the inference request. Model 'nope' is not ready.",
    ),
    "unknown_version": (
        {"model": "add_sub", "model_version": 5, "inputs": ADD_SUB_INPUTS},
        PREFIX.format("add_sub")
        + "Failed for execute the inference request. Model 'add_sub' is not ready.",
    ),
    "missing_input": (
        {"model": "add_sub", "inputs": ADD_SUB_INPUTS[:1]},
        PREFIX.format("add_sub")
        + "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'add_sub'. "
        "Got input(s) ['INPUT0'], but missing required input(s) ['INPUT1']. Please provide all "
        "required input(s).",
    ),
    "bad_dtype": (
        {"model": "add_sub", "inputs": [["INPUT0", "INT32", F], ADD_SUB_INPUTS[1]]},
        PREFIX.format("add_sub")
        + "[request id: <id_unknown>] inference input 'INPUT0' data-type is 'INT32', but model "
        "'add_sub' expects 'FP32'",
    ),
    "bad_shape": (
        {"model": "add_sub", "inputs": [["INPUT0", "FP32", [1, 2]], ADD_SUB_INPUTS[1]]},
        PREFIX.format("add_sub")
        + "[request id: <id_unknown>] unexpected shape for input 'INPUT0' for model 'add_sub'. "
        "Expected [4], got [2]. ",
    ),
    "bad_output": (
        {"model": "add_sub", "inputs": ADD_SUB_INPUTS, "outputs": ["NOPE"]},
        PREFIX.format("add_sub") + "unexpected inference output 'NOPE' for model 'add_sub'",
    ),
    "callee_error_code": (
        {"model": "raiser", "inputs": [["INPUT0", "FP32", F]], "parameters": {"not_found": True}},
        "raiser says not found",
    ),
    "decoupled_without_flag": (
        {"model": "repeat_dec", "inputs": [["IN", "INT32", [2]]]},
        PREFIX.format("repeat_dec")
        + "Model repeat_dec is using the decoupled. The current BLS request call doesn't "
        "support models using the decoupled transaction policy. Please use 'decoupled=True' "
        "argument to the 'exec' or 'async_exec' calls for decoupled models.'",
    ),
}


@pytest.mark.parametrize("case", ERRORS)
def test_errors_come_back_inside_the_response(repo, caller, case):
    spec, text = ERRORS[case]
    assert one(probe(repo, spec, caller)) == {"error": [1, text], "outputs": {}}


def test_callee_exception_text_has_no_prefix(repo):
    got = one(probe(repo, {"model": "raiser", "inputs": [["INPUT0", "FP32", F]]}))
    code, message = got["error"]
    assert code == 1
    assert message.startswith(
        "Failed to process the request(s) for model 'raiser_0_0', message: ValueError: raiser "
        "refuses\n\nAt:\n"
    )


def test_bad_parameters_raise_in_the_caller(repo):
    spec = {"model": "add_sub", "inputs": [], "parameters": {"f": 1.5}}
    assert probe(repo, spec) == {
        "raised": "TritonModelException: Expect parameters values to have type bool/int/str, "
        "found type <class 'float'>"
    }


def test_request_metadata_reaches_the_callee(repo, caller):
    spec = {
        "model": "echo_request",
        "inputs": [["INPUT0", "FP32", F]],
        "request_id": "rid-7",
        "correlation_id": 42,
        "flags": 3,
        "timeout": 5000000,
        "parameters": {"p": "s", "n": 3, "b": True},
    }
    info = json.loads(one(probe(repo, spec, caller))["outputs"]["INFO"][2][0])
    assert info == {
        "correlation_id": 42,
        "flags": 3,
        "inputs": ["INPUT0"],
        "parameters": {"b": True, "n": 3, "p": "s"},
        "request_id": "rid-7",
        "requested_output_names": ["INFO"],
        "timeout": 5000000,
    }


def test_string_correlation_id(repo):
    spec = {"model": "echo_request", "inputs": [["INPUT0", "FP32", F]], "correlation_id": "s-a"}
    info = json.loads(one(probe(repo, spec))["outputs"]["INFO"][2][0])
    assert info["correlation_id"] == "s-a"


def test_timeout_does_not_cut_a_model_without_queue_policy(repo):
    # Triton 2.51 runs the call to the end: the timeout only bounds a batcher's queue [V].
    spec = {
        "model": "slow",
        "inputs": [["INPUT0", "FP32", F]],
        "timeout": 1000,
        "parameters": {"sleep_ms": 100},
    }
    assert one(probe(repo, spec))["outputs"] == {"OUTPUT0": fp32(F)}


def test_decoupled_iterator_ends_with_an_empty_response(repo, caller):
    spec = {"model": "repeat_dec", "inputs": [["IN", "INT32", [2]]], "decoupled": True}
    assert probe(repo, spec, caller)["responses"] == [
        {"error": None, "outputs": {"OUT": ["int32", [1], [0]]}},
        {"error": None, "outputs": {"OUT": ["int32", [1], [1]]}},
        {"error": None, "outputs": {}},
    ]


def test_decoupled_zero_responses(repo):
    spec = {"model": "repeat_dec", "inputs": [["IN", "INT32", [0]]], "decoupled": True}
    assert probe(repo, spec)["responses"] == [{"error": None, "outputs": {}}]


def test_decoupled_flag_on_a_default_model_gives_one_response(repo):
    spec = {"model": "add_sub", "inputs": ADD_SUB_INPUTS, "decoupled": True}
    assert len(probe(repo, spec)["responses"]) == 1


def test_decoupled_unknown_model_gives_one_error(repo):
    spec = {"model": "nope", "inputs": [["INPUT0", "FP32", F]], "decoupled": True}
    assert probe(repo, spec)["responses"] == [
        {
            "error": [
                1,
                PREFIX.format("nope")
                + "Failed for execute the inference request. Model 'nope' is not ready.",
            ],
            "outputs": {},
        }
    ]


def test_cancel_stops_a_decoupled_callee(repo):
    # cancel() is Triton ~25.05+ (2.51 has no such attribute); the callee checks is_cancelled().
    spec = {
        "model": "repeat_dec",
        "inputs": [["IN", "INT32", [50]]],
        "decoupled": True,
        "cancel_after": 2,
        # 100 ms per response: cancelled after the 2nd (~0.1 s), the callee must stop before
        # its 9th (0.8 s), which leaves 0.7 s to spare.
        "parameters": {"delay_ms": 100},
    }
    responses = probe(repo, spec)["responses"]
    assert 3 <= len(responses) < 10
    assert responses[-1] == {"error": None, "outputs": {}}


def test_async_exec_with_gather(repo):
    add = {"model": "add_sub", "inputs": ADD_SUB_INPUTS, "outputs": ["OUTPUT0"]}
    version = {"model": "versioned", "model_version": 2, "inputs": [["INPUT0", "FP32", F]]}
    got = probe(repo, {"gather": [add, version, add]}, "bls_async")["gather"]
    assert [one(r)["outputs"] for r in got] == [
        {"OUTPUT0": fp32([2.0, 4.0, 6.0, 8.0])},
        {"OUTPUT0": fp32([2.0, 4.0, 6.0, 8.0])},
        {"OUTPUT0": fp32([2.0, 4.0, 6.0, 8.0])},
    ]


def test_ensemble_through_bls(repo):
    spec = {"model": "pipeline", "inputs": [["RAW", "FP32", F]]}
    assert one(probe(repo, spec))["outputs"] == {
        "RESULT": fp32([3.0, 15.0, 35.0, 63.0]),
        "SUM": fp32([3.0, 5.0, 7.0, 9.0]),
    }


# -- deadlocks: Triton hangs on these (`recurse` with DEPTH 1 never answers) [V] -----------------


def trace(repo: LoadedRepository, model: str, depth: int) -> str:
    depth_tensor = pb_utils.Tensor("DEPTH", np.array([depth], dtype=np.int32))
    response = repo.models[model].infer(InferRequest([depth_tensor]), timeout=20)
    assert not response.has_error(), response.error().message()
    return response.output_tensors()[0].as_numpy()[0].decode()


def test_model_calling_itself_with_one_instance(repo):
    assert trace(repo, "recurse", 3) == "recurse>recurse>recurse>recurse"


def test_two_models_calling_each_other(repo):
    assert trace(repo, "ping", 4) == "ping>pong>ping>pong>ping"


def test_concurrent_recursions_all_finish(repo):
    results: list[str] = []
    threads = [
        threading.Thread(target=lambda: results.append(trace(repo, "ping", 3))) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert results == ["ping>pong>ping>pong"] * 4


def test_bls_outside_execute_is_refused():
    request = pb_utils.InferenceRequest(model_name="add_sub", inputs=[], requested_output_names=[])
    with pb_utils.context.phase("initialize"):
        with pytest.raises(pb_utils.TritonModelException, match="only supported during"):
            request.exec()


def test_executor_reads_the_models_dict_live(repo):
    models: dict[str, Any] = {}
    executor = BlsExecutor(Scope(models))
    request = pb_utils.InferenceRequest(
        model_name="scale",
        inputs=[pb_utils.Tensor("IN", np.array(F, dtype=np.float32))],
        requested_output_names=["SCALED"],
    )
    assert executor(request, False).has_error()
    models["scale"] = repo.models["scale"]  # what a hot reload swap does
    response = executor(request, False)
    assert response.output_tensors()[0].as_numpy().tolist() == [2.0, 4.0, 6.0, 8.0]


def test_inputs_are_passed_without_a_copy(repo):
    array = np.array(F, dtype=np.float32)
    tensor = pb_utils.Tensor("INPUT0", array)
    request = pb_utils.InferenceRequest(
        model_name="echo_request", inputs=[tensor], requested_output_names=[]
    )
    seen: list[Any] = []
    model = repo.models["echo_request"]
    original = model.submit

    def spy(infer_request: InferRequest, respond: Any) -> Any:
        seen.extend(infer_request.inputs)
        return original(infer_request, respond)

    model.submit = spy  # type: ignore[method-assign]
    try:
        BlsExecutor(Scope(repo.models))(request, False)
    finally:
        del model.submit
    assert seen[0] is tensor and seen[0].as_numpy() is array


# -- async decoupled BLS runs concurrently (issue 24) ---------------------------------------------

_GATE_MODEL = """
import itertools
import os
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

ARRIVALS = itertools.count()
# Every request waits here until all four are in the callee at once; a caller that made them one
# after another breaks the barrier, and the request gets an error response.
BARRIER = threading.Barrier(4, timeout=10)


class TritonPythonModel:
    def initialize(self, args):
        self.folder = args["model_repository"]

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._answer, args=(request,), daemon=True).start()
        return None

    def _answer(self, request):
        sender = request.get_response_sender()
        open(os.path.join(self.folder, f"arrived.{next(ARRIVALS)}"), "w").close()
        try:
            BARRIER.wait()
            out = pb_utils.Tensor("OUT", np.array([1], dtype=np.int32))
            sender.send(pb_utils.InferenceResponse([out]))
        except threading.BrokenBarrierError:
            error = pb_utils.TritonError("the four requests were never in the callee at once")
            sender.send(pb_utils.InferenceResponse([], error=error))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

_ASYNC_CALLER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="gate", inputs=[], requested_output_names=["OUT"]
            )
            iterator = await call.async_exec(decoupled=True)
            errors = [r.error().message() for r in iterator if r.has_error()]
            text = np.array([";".join(errors).encode()], dtype=object)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("ERRORS", text)]))
        return responses
"""


def _model(root: Path, name: str, source: str, config: str) -> None:
    """A model folder `root/name` with `source` as version 1's model.py."""
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(source)
    (root / name / "config.pbtxt").write_text(config)


def test_async_decoupled_bls_calls_overlap(tmp_path: Path) -> None:
    """`await async_exec(decoupled=True)` returns with the first response in (as Triton's stub
    does), so four concurrent requests of an async model are in the decoupled callee at once.
    It returned at once before, and the model's `for r in iterator` then blocked the instance's
    event loop while it waited, so requests that came after the first could not start (Triton's
    concurrency_test test_concurrent_execute_multi_request_bls)."""
    _model(
        tmp_path,
        "gate",
        _GATE_MODEL,
        (
            'backend: "python"\nmodel_transaction_policy { decoupled: true }\n'
            'output [{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }]\n'
        ),
    )
    _model(
        tmp_path,
        "caller",
        _ASYNC_CALLER,
        ('backend: "python"\noutput [{ name: "ERRORS" data_type: TYPE_STRING dims: [ 1 ] }]\n'),
    )
    loaded = load_repository([tmp_path])
    try:
        assert not loaded.failures, loaded.failures
        answers: list[Any] = [None] * 4

        def call(i: int) -> None:
            answers[i] = loaded.models["caller"].infer(InferRequest([]), timeout=30)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
        threads[0].start()
        # The others come once the first is waiting in the callee, as on a client's stream.
        arrived = tmp_path / "gate" / "arrived.0"
        for _ in range(300):
            if arrived.exists():
                break
            threading.Event().wait(0.05)
        assert arrived.exists()
        for thread in threads[1:]:
            thread.start()
        for thread in threads:
            thread.join(60)
        for response in answers:
            assert response is not None and not response.has_error()
            assert response.output_tensors()[0].as_numpy()[0] == b""
    finally:
        loaded.close()


_UNTIL_CANCELLED = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        sender = requests[0].get_response_sender()
        for _ in range(200):  # bounded: 200 responses at most
            if requests[0].is_cancelled():
                error = pb_utils.TritonError("stopped", pb_utils.TritonError.CANCELLED)
                final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                sender.send(pb_utils.InferenceResponse(error=error), flags=final)
                return None
            out = pb_utils.Tensor("OUT", np.array([1], dtype=np.int32))
            sender.send(pb_utils.InferenceResponse([out]))
            time.sleep(0.01)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

_CANCELLING_CALLER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        call = pb_utils.InferenceRequest(
            model_name="until_cancelled", inputs=[], requested_output_names=["OUT"]
        )
        stream = call.exec(decoupled=True)
        total, code = 0, None
        for response in stream:
            if response.has_error():
                code = response.error().code()
                break
            total += int(response.output_tensors()[0].as_numpy()[0])
            if total == 3:
                stream.cancel()
        answer = np.array([total, -1 if code is None else int(code)], dtype=np.int32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("ANSWER", answer)])]
"""


def test_a_cancelled_decoupled_call_reports_cancelled(tmp_path: Path) -> None:
    """`ResponseIterator.cancel()` and the callee's TritonError(CANCELLED) reach the caller with
    that code, as in the Triton releases that have cancel() (decoupled_test.py
    test_decoupled_bls_cancel); 2.51's rule (every BLS error INTERNAL) would hide it."""
    _model(
        tmp_path,
        "until_cancelled",
        _UNTIL_CANCELLED,
        (
            'backend: "python"\nmodel_transaction_policy { decoupled: true }\n'
            'output [{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }]\n'
        ),
    )
    _model(
        tmp_path,
        "caller",
        _CANCELLING_CALLER,
        ('backend: "python"\noutput [{ name: "ANSWER" data_type: TYPE_INT32 dims: [ 2 ] }]\n'),
    )
    loaded = load_repository([tmp_path])
    try:
        assert not loaded.failures, loaded.failures
        response = loaded.models["caller"].infer(InferRequest([]), timeout=30)
        assert not response.has_error()
        total, code = response.output_tensors()[0].as_numpy().tolist()
        assert code == pb_utils.TritonError.CANCELLED
        assert 3 <= total < 200
    finally:
        loaded.close()
