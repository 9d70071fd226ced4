"""Tracing against Triton 2.51: the trace file's contents and the trace settings, with a trace
file configured (`--trace-config triton,file=...`) on both servers.

Each server writes its own file (log frequency 1: one `<file>.<n>` per trace), and the test
compares what is in them as Triton's trace summary tool reads them: the traces in the order
they appear, and per trace the names and order of its timestamps (the server's, and the
wire's), its header (model, version, request id, which trace is its parent), and at level
TENSORS the tensors it dumps (name, data, shape, dtype). Not compared: the `ns` values, the
trace ids themselves (numbered in order of appearance instead), and how the wire's timestamps
interleave with the server's (a race in Triton).

The settings steps (last, since they change what is traced) compare TraceSetting answers over
gRPC step by step, the trace file's path aside (each server has its own).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.differential.support import REPOSITORIES
from tests.differential.test_diff_settings import outcome, trace_request
from tests.harness.bridge_server import BridgeServer
from tests.harness.oracle import TritonOracle, require_oracle

pytestmark = pytest.mark.oracle  # the triton door whatever DYN_BRIDGE_FRONTEND says

REPO = REPOSITORIES / "composition"
MODELS = ("add_sub", "scale", "multiply", "pipeline", "bls")
TRACED = ("--trace-config=level=TIMESTAMPS", "--trace-config=level=TENSORS")
X = np.array([1, 2, 3, 4], np.float32)


class Traced:
    """One server with its trace file, and the trace files it has written so far."""

    def __init__(self, server: Any, trace_file: Path) -> None:
        self.server = server
        self.trace_file = trace_file
        self.read = 0

    def next_trace(self, timeout: float = 30.0) -> list[dict[str, Any]]:
        """The next `<file>.<n>` once it is whole (written after its trace ended)."""
        path = Path(f"{self.trace_file}.{self.read}")
        deadline = time.monotonic() + timeout
        while True:
            if path.exists():
                text = path.read_text()
                if text.endswith("]"):
                    self.read += 1
                    return _loads(text)
            if time.monotonic() > deadline:
                raise AssertionError(f"no trace file {path} within {timeout}s")
            time.sleep(0.05)


# Triton writes a BYTES tensor's string between quotes it does not escape inside the JSON
# string (not JSON then); the bridge escapes them. Either way the data is set aside.
_BYTES_DATA = re.compile(r'"data":"\\".*?\\"","shape"')


def _loads(text: str) -> list[dict[str, Any]]:
    return json.loads(_BYTES_DATA.sub('"data":"<bytes>","shape"', text))


WIRE = {
    "HTTP_RECV_START",
    "HTTP_RECV_END",
    "HTTP_SEND_START",
    "HTTP_SEND_END",
    "GRPC_WAITREAD_START",
    "GRPC_WAITREAD_END",
    "GRPC_SEND_START",
    "GRPC_SEND_END",
    "INFER_RESPONSE_COMPLETE",
}


def shape(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What is compared of one trace file, per trace in order of first appearance: its header,
    the names of the server's timestamps in order, the names of the wire's in order, and its
    tensors (sorted: Triton's input order is a map's). Triton writes each timestamp when it
    happens, so how the wire's interleave with the server's changes from run to run [V]."""
    traces: dict[int, dict[str, Any]] = {}

    def trace(trace_id: int) -> dict[str, Any]:
        return traces.setdefault(
            trace_id, {"number": len(traces), "core": [], "wire": [], "tensors": []}
        )

    for item in objects:
        entry = trace(item["id"])
        if "activity" in item:
            t = item["tensor"]
            entry["tensors"].append(
                (item["activity"], t["name"], t["shape"], t["dtype"], t["data"])
            )
        elif "timestamps" in item:
            for stamp in item["timestamps"]:
                entry["wire" if stamp["name"] in WIRE else "core"].append(stamp["name"])
        else:
            parent = item.get("parent_id")
            entry["header"] = (
                item["model_name"],
                item["model_version"],
                item.get("request_id"),
                None if parent is None else trace(parent)["number"],
            )
    for entry in traces.values():
        entry["tensors"].sort()
    return list(traces.values())


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Traced, Traced]]:
    require_oracle()
    folder = tmp_path_factory.mktemp("traces")
    loads = [f"--load-model={m}" for m in MODELS]
    common = (
        "--model-control-mode=explicit",
        *loads,
        *TRACED,
        "--trace-config=rate=1",
        "--trace-config=triton,log-frequency=1",
    )
    oracle_file, bridge_file = folder / "oracle.json", folder / "bridge.json"
    oracle = TritonOracle(
        REPO,
        *common,
        f"--trace-config=triton,file={oracle_file}",
        log_path=folder / "tritonserver.log",
    )
    bridge = BridgeServer(
        REPO,
        "--frontend=triton",
        *common,
        f"--trace-config=triton,file={bridge_file}",
        log_path=folder / "bridge.log",
    )
    with oracle, bridge:
        yield Traced(oracle, oracle_file), Traced(bridge, bridge_file)


def _http_add_sub(server: Any) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [4], "FP32")
        tensor.set_data_from_numpy(X)
        inputs.append(tensor)
    client.infer("add_sub", inputs, request_id="r-http")


def _grpc(server: Any, model: str, inputs: dict[str, tuple[str, np.ndarray]]) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensors = []
    for name, (datatype, array) in inputs.items():
        tensor = grpcclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    client.infer(model, tensors)


BLS_SPEC = json.dumps(
    {
        "model": "add_sub",
        "outputs": ["OUTPUT0"],
        "inputs": [["INPUT0", "FP32", [1, 2, 3, 4]], ["INPUT1", "FP32", [1, 1, 1, 1]]],
    }
)
CALLS = {
    "http add_sub": _http_add_sub,
    "grpc add_sub": lambda s: _grpc(s, "add_sub", {"INPUT0": ("FP32", X), "INPUT1": ("FP32", X)}),
    "grpc ensemble": lambda s: _grpc(s, "pipeline", {"RAW": ("FP32", X)}),
    "grpc bls (its call is not traced)": lambda s: _grpc(
        s, "bls", {"SPEC": ("BYTES", np.array([BLS_SPEC.encode()], object))}
    ),
}


def test_refused_request_is_answered_and_untraced_as_triton(servers) -> None:
    """A traced request its model refuses (a wrong shape) is answered at once, with Triton's
    error; then the next trace is the next request's on both."""
    oracle, bridge = servers
    answers = []
    for traced in (oracle, bridge):
        started = time.monotonic()
        with pytest.raises(InferenceServerException) as caught:
            _grpc(traced.server, "add_sub", {"INPUT0": ("FP32", X[:3]), "INPUT1": ("FP32", X)})
        assert time.monotonic() - started < 10  # not held back waiting for a trace's end
        answers.append((caught.value.status(), caught.value.message()))
        _grpc(traced.server, "add_sub", {"INPUT0": ("FP32", X), "INPUT1": ("FP32", X)})
    assert answers[1] == answers[0]
    assert shape(bridge.next_trace()) == shape(oracle.next_trace())


def test_trace_files_as_triton(servers) -> None:
    oracle, bridge = servers
    for what, call in CALLS.items():
        call(oracle.server)
        call(bridge.server)
        expected = shape(oracle.next_trace())
        got = shape(bridge.next_trace())
        assert got == expected, f"{what}:\n{got}\n{expected}"


TRACE_STEPS: list[tuple[str, dict[str, list[str] | None]]] = [
    ("", {}),
    ("add_sub", {}),
    ("", {"trace_level": ["TIMESTAMPS"]}),
    ("add_sub", {"trace_level": ["TENSORS"], "trace_count": ["3"]}),
    ("add_sub", {}),
    ("", {"trace_rate": ["0"]}),
    ("add_sub", {"trace_rate": ["0"]}),
    ("", {"trace_level": ["OFF"]}),
    ("add_sub", {}),
    ("add_sub", {"trace_level": None, "trace_count": None}),
    ("add_sub", {}),
    ("", {"trace_level": None, "trace_rate": ["10"], "log_frequency": ["0"]}),
    ("", {"trace_file": ["/tmp/elsewhere.json"]}),
    ("", {"trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": ["1"], "log_frequency": ["1"]}),
    ("", {}),
]


def test_trace_settings_with_a_trace_file_as_triton(servers) -> None:
    oracle, bridge = servers
    stubs = [
        service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(t.server.grpc_url))
        for t in (oracle, bridge)
    ]
    for model, step in TRACE_STEPS:
        request = trace_request(model, **step)
        expected, got = (outcome(stub.TraceSetting, request) for stub in stubs)
        for answer in (expected, got):
            if isinstance(answer, dict):
                answer["trace_file"] = ["<file>"]
        assert got == expected, (model, step)


def test_log_frequency_zero_writes_the_file_at_exit(tmp_path) -> None:
    """Log frequency 0: the traces go to `file` itself, one JSON array closed at exit (the
    bridge only: how Triton's file ends depends on how it is stopped)."""
    trace_file = tmp_path / "trace.json"
    bridge = BridgeServer(
        REPO,
        "--frontend=triton",
        "--model-control-mode=explicit",
        "--load-model=add_sub",
        "--trace-config=level=TIMESTAMPS",
        "--trace-config=rate=1",
        f"--trace-config=triton,file={trace_file}",
        log_path=tmp_path / "bridge.log",
    )
    with bridge:
        for _ in range(2):
            _grpc(bridge, "add_sub", {"INPUT0": ("FP32", X), "INPUT1": ("FP32", X)})
    objects = json.loads(trace_file.read_text())
    assert [t["header"][0] for t in shape(objects)] == ["add_sub", "add_sub"]
