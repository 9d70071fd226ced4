"""The triton door while it shuts down answers as tritonserver does [V, Triton 2.51]:

- ServerLive and ServerReady: UNAVAILABLE "Server exiting";
- ModelReady, RepositoryIndex, ModelStatistics: UNAVAILABLE "Server not ready";
- a new inference (unary or on a stream), ModelMetadata, ModelConfig: NOT_FOUND "Request for
  unknown model: '<name>' has no available versions";

while the request in flight when the shutdown began finishes with its answer. The in-flight
request is held by a gate file (tests/e2e/support.py `Gate`), so nothing is timed.
"""

from __future__ import annotations

import signal
import threading

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tests.e2e.support import SERVING, WAIT_S, Gate, fp32_input, wait_until
from tests.harness.roles import Frontend, Worker

NO_VERSIONS = "Request for unknown model: '{}' has no available versions"


def status(call, request) -> tuple[str, str]:
    try:
        call(request, timeout=WAIT_S)
    except grpc.RpcError as exc:
        return str(exc.code()), exc.details()
    return "OK", ""


def echo_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(
        model_name="echo",
        inputs=[pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="FP32", shape=[2])],
    )
    request.raw_input_contents.append(np.ones(2, np.float32).tobytes())
    return request


@pytest.mark.parametrize("mode", ["embedded", "frontend"])
def test_answers_while_exiting(bridge_server, tmp_path, mode):
    """Embedded (`--role all`), and a `--role frontend` door in front of a worker (which goes on
    serving: only the door exits)."""
    exit_flags = ("--frontend", "triton", "--exit-timeout-secs", "60")
    worker = server = None
    try:
        if mode == "embedded":
            server = bridge_server(SERVING, *exit_flags)
        else:
            env = {"DYN_FILE_KV": str(tmp_path / "kv"), "DYN_DISCOVERY_BACKEND": "file"}
            worker = Worker(SERVING, env=env, log_path=tmp_path / "worker.log").start()
            server = Frontend(*exit_flags, env=env, log_path=tmp_path / "frontend.log").start()
        client = server.client()
        wait_until(lambda: client.is_model_ready("pool"), "pool")
        gate = Gate(tmp_path)
        answer: dict = {}

        def in_flight() -> None:
            try:
                result = client.infer("pool", [fp32_input([2.0])], parameters=gate.params("a"))
                answer["values"] = result.as_numpy("OUTPUT0").tolist()
            except Exception as exc:  # reported by the assertion below
                answer["error"] = exc

        thread = threading.Thread(target=in_flight)
        thread.start()
        wait_until(lambda: gate.started("a"), "the request to reach the model")
        stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url))
        server.process.send_signal(signal.SIGTERM)

        exiting = ("StatusCode.UNAVAILABLE", "Server exiting")
        wait_until(
            lambda: status(stub.ServerLive, pb.ServerLiveRequest()) == exiting, "Server exiting"
        )
        assert status(stub.ServerReady, pb.ServerReadyRequest()) == exiting
        not_ready = ("StatusCode.UNAVAILABLE", "Server not ready")
        assert status(stub.ModelReady, pb.ModelReadyRequest(name="echo")) == not_ready
        assert status(stub.RepositoryIndex, pb.RepositoryIndexRequest()) == not_ready
        assert status(stub.ModelStatistics, pb.ModelStatisticsRequest(name="echo")) == not_ready
        gone = ("StatusCode.NOT_FOUND", NO_VERSIONS.format("echo"))
        assert status(stub.ModelInfer, echo_request()) == gone
        assert status(stub.ModelMetadata, pb.ModelMetadataRequest(name="echo")) == gone
        assert status(stub.ModelConfig, pb.ModelConfigRequest(name="echo")) == gone
        streamed = list(stub.ModelStreamInfer(iter([echo_request()]), timeout=WAIT_S))
        assert [r.error_message for r in streamed] == [NO_VERSIONS.format("echo")]

        gate.open()
        thread.join(WAIT_S)
        assert answer == {"values": [2.0]}
        assert server.process.wait(WAIT_S) == 0
    finally:
        if server is not None:
            server.stop()  # also when a step above failed: no process outlives the test
        if worker is not None:
            worker.stop()
