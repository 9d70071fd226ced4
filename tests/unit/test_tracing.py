"""What the loader measures for a traced request (model_repository_loader/tracing.py), in
process over tests/repositories/composition: the timestamps in Triton's order, the tensors as
Triton's trace file writes them, ensemble steps and BLS calls as children, the trace's end.

The trace file's shape against Triton is tests/differential/test_diff_tracing.py; the spans,
tests/e2e/test_tracing_otel.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from model_repository_loader import pb_utils
from model_repository_loader.inference import InferRequest
from model_repository_loader.loader import LoadedRepository, load_repository
from model_repository_loader.tracing import RequestTrace

REPO = Path(__file__).resolve().parents[2] / "tests" / "repositories" / "composition"
F = np.array([1.0, 2.5, 3.0, 4.0], dtype=np.float32)
ORDER = [
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
]


@pytest.fixture(scope="module")
def repo() -> Iterator[LoadedRepository]:
    loaded = load_repository([REPO])
    yield loaded
    loaded.close()


def traced(repo: LoadedRepository, model: str, inputs: dict[str, np.ndarray]) -> RequestTrace:
    """Run one traced request; its trace once complete."""
    trace = RequestTrace(tensors=True)
    tensors = [pb_utils.Tensor(name, array) for name, array in inputs.items()]
    repo.models[model].infer(InferRequest(tensors, trace=trace), timeout=20)
    complete = threading.Event()
    if trace.when_complete(complete.set):
        assert complete.wait(20)
    return trace


def in_order(times: dict[str, int], names: list[str]) -> bool:
    return list(times) == names and [times[n] for n in names] == sorted(times.values())


def test_a_model_request(repo):
    trace = traced(repo, "add_sub", {"INPUT0": F, "INPUT1": F})
    wire = trace.to_wire()
    assert (wire["model_name"], wire["model_version"]) == ("add_sub", 1)
    assert sorted(wire["times"]) == sorted(ORDER)
    assert [wire["times"][n] for n in ORDER] == sorted(wire["times"].values())
    assert wire["inputs"] == [
        ["INPUT0", "1,2.5,3,4", "4", "FP32"],
        ["INPUT1", "1,2.5,3,4", "4", "FP32"],
    ]
    assert ["OUTPUT0", "2,5,6,8", "4", "FP32"] in wire["outputs"]


def test_ensemble_steps_are_children(repo):
    wire = traced(repo, "pipeline", {"RAW": F}).to_wire()
    assert set(wire["times"]) == {"REQUEST_START", "QUEUE_START", "REQUEST_END"}
    steps = [(c["model_name"], c["kind"]) for c in wire["children"]]
    assert steps == [("scale", "ENSEMBLE_STEP"), ("add_sub", "ENSEMBLE_STEP"),
                     ("multiply", "ENSEMBLE_STEP")]  # fmt: skip
    for child in wire["children"]:
        assert sorted(child["times"]) == sorted(ORDER)
        assert wire["times"]["REQUEST_START"] <= child["times"]["REQUEST_START"]
        assert child["times"]["REQUEST_END"] <= wire["times"]["REQUEST_END"]


def test_bls_call_is_traced_only_with_the_callers_trace(repo):
    spec = {"model": "add_sub", "inputs": [["INPUT0", "FP32", [1, 2]], ["INPUT1", "FP32", [1]]]}
    # the probe does not pass trace=request.trace(): its call is not a child (as in Triton)
    wire = traced(repo, "bls", {"SPEC": np.array([json.dumps(spec).encode()], object)}).to_wire()
    assert "children" not in wire
    assert wire["inputs"][0][1].startswith('"{') and wire["inputs"][0][3] == "BYTES"


def test_refused_request_is_never_started(repo):
    trace = RequestTrace()
    bad = [pb_utils.Tensor("INPUT0", F[:3]), pb_utils.Tensor("INPUT1", F)]
    response = repo.models["add_sub"].infer(InferRequest(bad, trace=trace), timeout=20)
    assert response.has_error()
    assert trace.times == {}  # the bridge does not wait for such a trace's end (worker.py)
