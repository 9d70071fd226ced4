"""The triton front door (`--frontend triton`): bad input, TLS and mTLS, concurrent streams.

Bad input is sent raw (tritonclient's service_pb2 and a bytes-level call, no client-side
checks): each gets Triton's status and text, and the server keeps answering everything else.
TLS uses certificates made here with `openssl` (a CA, a server leaf for 127.0.0.1, a client
leaf), and a real `tritonclient` over TLS.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.e2e.reload_support import ask_marked, copy_models, set_line
from tests.e2e.support import (
    SERVING,
    WAIT_S,
    Gate,
    cancellation_gate,
    fp32_input,
    wait_for_file,
    wait_until,
)
from tests.e2e.test_roles import http_text
from tests.harness import BridgeServer, free_port
from tests.harness.roles import SYSTEM_PORTS, Frontend, Worker
from tests.harness.sockets import listening_addresses

DOOR = ("--frontend", "triton")
T = pb.ModelInferRequest.InferInputTensor
FOUR = np.arange(4, dtype=np.float32)


def raw_request(
    model: str, datatype: str, shape: list[int], raw: bytes, **kw
) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(
        model_name=model, inputs=[T(name="INPUT0", datatype=datatype, shape=shape)], **kw
    )
    request.raw_input_contents.append(raw)
    return request


def good_request() -> pb.ModelInferRequest:
    return raw_request("identity_fp32", "FP32", [1, 4], FOUR.tobytes())


@pytest.fixture(scope="module")
def dtypes(shared_bridge_server, repository) -> BridgeServer:
    # Its models share one model.py; clients may register shared memory (system_shared_memory).
    return shared_bridge_server(repository("dtypes"), *DOOR, "--allow-client-shm")


@pytest.fixture
def stub(dtypes: BridgeServer):
    channel = grpc.insecure_channel(dtypes.grpc_url, options=[("grpc.max_send_message_length", -1)])
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def assert_serving(stub) -> None:
    """A good request still gets its answer."""
    response = stub.ModelInfer(good_request(), timeout=WAIT_S)
    assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == FOUR.tolist()


def status_of(stub, request: pb.ModelInferRequest) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request, timeout=WAIT_S)
    return caught.value.code(), caught.value.details()


# -- bad input ------------------------------------------------------------------------------------


def bytes_raw(*elements: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


BAD = {
    "short-raw": (
        raw_request("identity_fp32", "FP32", [1, 4], FOUR.tobytes()[:12]),
        "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model "
        "'identity_fp32'. Expected 16, got 12",
    ),
    "huge-shape": (
        raw_request("identity_fp32", "FP32", [1, 1 << 40], FOUR.tobytes()),
        "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model "
        "'identity_fp32'. Expected 4398046511104, got 16",
    ),
    "bytes-length-past-end": (
        raw_request("identity_bytes", "BYTES", [1, 2], bytes_raw(b"abc") + struct.pack("<I", 9)),
        "incomplete string data for inference input 'INPUT0', expecting string of length 9 but "
        "only 0 bytes available",
    ),
    "bytes-broken-prefix": (
        raw_request("identity_bytes", "BYTES", [1, 1], bytes_raw(b"abc") + b"zz"),
        "[request id: <id_unknown>] incomplete string length indicator for inference input "
        "'INPUT0' for model 'identity_bytes', expecting 4 bytes but only 2 bytes available. "
        "Please make sure the string length indicator is in one buffer.",
    ),
    "bytes-huge-shape": (
        raw_request("identity_bytes", "BYTES", [1, 1 << 40], bytes_raw(b"abc")),
        "[request id: <id_unknown>] expected 1099511627776 string elements for inference input "
        "'INPUT0' for model 'identity_bytes', got 1",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_gets_triton_text(stub, case: str):
    request, text = BAD[case]
    assert status_of(stub, request) == (grpc.StatusCode.INVALID_ARGUMENT, text)
    assert_serving(stub)


def test_malformed_protobuf(stub, dtypes: BridgeServer):
    channel = grpc.insecure_channel(dtypes.grpc_url)
    method = "/inference.GRPCInferenceService/ModelInfer"
    call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    with pytest.raises(grpc.RpcError) as caught:
        call(b"\xff\xff\xff\x0f", timeout=WAIT_S)
    assert (caught.value.code(), caught.value.details()) == (
        grpc.StatusCode.INTERNAL,
        "Unable to parse request",
    )
    channel.close()
    assert_serving(stub)


def test_bad_requests_on_a_stream_leave_it_open(stub):
    """Errors travel in-stream; the good requests around them are answered."""
    requests = [good_request(), BAD["short-raw"][0], good_request(), BAD["bytes-broken-prefix"][0]]
    answers = list(stub.ModelStreamInfer(iter(requests), timeout=WAIT_S))
    errors = sorted(a.error_message for a in answers if a.error_message)
    assert errors == sorted([BAD["short-raw"][1], BAD["bytes-broken-prefix"][1]])
    assert len([a for a in answers if not a.error_message]) == 2


def test_big_message_past_grpc_default_cap(dtypes: BridgeServer):
    """8 MiB in and out: no 4 MiB cap (Triton takes up to INT32_MAX bytes)."""
    array = np.arange(1 << 21, dtype=np.float32).reshape(1, -1)
    client = grpcclient.InferenceServerClient(dtypes.grpc_url)
    try:
        tensor = grpcclient.InferInput("INPUT0", list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        result = client.infer("identity_fp32", [tensor])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), array)
    finally:
        client.close()


# -- one stream, many requests at once -----------------------------------------------------------


@contextlib.contextmanager
def two_held_on_one_stream(server: BridgeServer, gate: Gate) -> Iterator[list]:
    """Requests "a" then "b" to the two-instance `pool` model on one stream, each held at
    `gate` once it executes; yields the answers as they come. The gate opens on the way out."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: list = []
    client.start_stream(callback=lambda result, error: answers.append((result, error)))
    try:
        for i, tag in enumerate(("a", "b")):
            client.async_stream_infer(
                "pool", [fp32_input([float(i)])], request_id=tag, parameters=gate.params(tag)
            )
        yield answers
    finally:
        gate.open()
        client.stop_stream()
        client.close()


def answered_ids(answers: list) -> list[str]:
    return [result.get_response().id for result, error in answers if error is None]


def test_requests_on_one_stream_run_concurrently(shared_bridge_server, tmp_path):
    """Two held requests on one stream both start executing (on the two `pool` instances)
    before either is released; one request at a time would leave the second waiting."""
    gate = Gate(tmp_path)
    with two_held_on_one_stream(shared_bridge_server(SERVING, *DOOR), gate) as answers:
        wait_until(lambda: gate.started("a") and gate.started("b"), "both requests executing")
        assert answers == []
        gate.open()
        wait_until(lambda: len(answers) == 2, "both answers")
    assert sorted(answered_ids(answers)) == ["a", "b"]


def test_a_stream_s_requests_in_flight_are_bounded(shared_bridge_server, tmp_path):
    """`--grpc-stream-requests 1`: the stream's second request is read only once the first is
    answered, though the second `pool` instance is free (without the bound both execute at
    once: the test above). A client that sends without reading holds that many requests."""
    server = shared_bridge_server(SERVING, *DOOR, "--grpc-stream-requests=1")
    gate = Gate(tmp_path)
    with two_held_on_one_stream(server, gate) as answers:
        wait_until(lambda: gate.started("a"), "the first request executing")
        time.sleep(1.0)  # the second instance would take "b" within milliseconds
        assert not gate.started("b")
        gate.open()
        wait_until(lambda: len(answers) == 2, "both answers")
    assert answered_ids(answers) == ["a", "b"]


def test_a_unary_call_that_ends_early_cancels_its_request(bridge_server, tmp_path):
    """ModelInfer to this process's own worker (the unary path without a stream,
    ModelWorker.answer): a client's deadline, and a call it cancels, reach the model as
    `is_cancelled()` (it would otherwise run on for 20 s and write `not-cancelled`)."""
    repository, gates = cancellation_gate(tmp_path)
    server = bridge_server(repository, *DOOR)
    server.wait_model_ready("gate")

    def request(folder: Path) -> pb.ModelInferRequest:
        folder.mkdir()
        message = pb.ModelInferRequest(model_name="gate")
        message.inputs.add(name="DIR", datatype="BYTES", shape=[1])
        message.inputs[0].contents.bytes_contents.append(str(folder).encode())
        return message

    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as failure:
            stub.ModelInfer(request(gates / "deadline"), timeout=2.0)
        assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert wait_for_file(gates / "deadline", ("cancelled", "not-cancelled")) == "cancelled"

        call = stub.ModelInfer.future(request(gates / "cancel"))
        wait_for_file(gates / "cancel", ("started",))
        call.cancel()
        assert wait_for_file(gates / "cancel", ("cancelled", "not-cancelled")) == "cancelled"


# -- address and TLS -----------------------------------------------------------------------------


def test_binds_loopback_by_default(dtypes: BridgeServer):
    assert listening_addresses(dtypes.grpc_port) == {"127.0.0.1"}


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(folder: Path, name: str) -> tuple[Path, Path]:
    key, cert = folder / f"{name}.key", folder / f"{name}.crt"
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
            str(cert), "-days", "2", "-subj", f"/CN={name}")  # fmt: skip
    return key, cert


def make_leaf(folder: Path, name: str, ca: tuple[Path, Path], server: bool) -> tuple[Path, Path]:
    key, csr, cert = folder / f"{name}.key", folder / f"{name}.csr", folder / f"{name}.crt"
    ext = folder / f"{name}.ext"
    usage = "serverAuth" if server else "clientAuth"
    san = "subjectAltName=IP:127.0.0.1,DNS:localhost\n" if server else ""
    ext.write_text(f"{san}extendedKeyUsage={usage}\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
            "-subj", f"/CN={name}")  # fmt: skip
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[1]), "-CAkey", str(ca[0]),
            "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext))  # fmt: skip
    return key, cert


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, Path]:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test certificates")
    folder = tmp_path_factory.mktemp("certs")
    ca = make_ca(folder, "ca")
    other_ca = make_ca(folder, "other-ca")
    server = make_leaf(folder, "server", ca, server=True)
    client = make_leaf(folder, "client", ca, server=False)
    stranger = make_leaf(folder, "stranger", other_ca, server=False)
    return {
        "ca": ca[1],
        "server_key": server[0],
        "server_cert": server[1],
        "client_key": client[0],
        "client_cert": client[1],
        "stranger_key": stranger[0],
        "stranger_cert": stranger[1],
    }


def tls_client(server: BridgeServer, certs: dict[str, Path], who: str | None):
    return grpcclient.InferenceServerClient(
        server.grpc_url,
        ssl=True,
        root_certificates=str(certs["ca"]),
        private_key=str(certs[f"{who}_key"]) if who else None,
        certificate_chain=str(certs[f"{who}_cert"]) if who else None,
    )


class TlsBridgeServer(BridgeServer):
    """The door over TLS: started once a TLS client (with the client certificate, which a
    server without mTLS simply ignores) gets ServerReady; the harness's probe is plaintext."""

    def __init__(self, certs: dict[str, Path], *flags: str, log_path: Path) -> None:
        args = [*DOOR, "--grpc-use-ssl", "true", f"--grpc-server-cert={certs['server_cert']}",
                f"--grpc-server-key={certs['server_key']}", *flags]  # fmt: skip
        super().__init__(SERVING, *args, log_path=log_path)
        self.certs = certs

    def _wait_started(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while True:
            client = tls_client(self, self.certs, "client")
            try:
                if client.is_server_ready():
                    return
            except InferenceServerException:
                pass  # not listening yet
            finally:
                client.close()
            if not self.running or time.monotonic() >= deadline:
                raise RuntimeError(f"TLS door not ready; log:\n{self.log_tail()}")
            time.sleep(0.1)


@pytest.fixture
def start_tls(certs, tmp_path):
    started: list[BridgeServer] = []

    def start(*flags: str) -> BridgeServer:
        server = TlsBridgeServer(certs, *flags, log_path=tmp_path / f"bridge-{len(started)}.log")
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


def infer_echo(client) -> np.ndarray:
    return client.infer("echo", [fp32_input([1.0, 2.0])]).as_numpy("OUTPUT0")


def test_tls(certs, start_tls):
    server = start_tls()
    client = tls_client(server, certs, None)
    try:
        assert client.is_server_live()
        np.testing.assert_array_equal(infer_echo(client), [1.0, 2.0])
    finally:
        client.close()
    plain = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException):
        plain.is_server_live(client_timeout=10)
    plain.close()


def test_mutual_tls(certs, start_tls):
    server = start_tls("--grpc-use-ssl-mutual", "true", f"--grpc-root-cert={certs['ca']}")
    client = tls_client(server, certs, "client")
    try:
        np.testing.assert_array_equal(infer_echo(client), [1.0, 2.0])
    finally:
        client.close()
    for who in (None, "stranger"):  # no client certificate; one from another CA
        refused = tls_client(server, certs, who)
        with pytest.raises(InferenceServerException):
            refused.is_server_live(client_timeout=10)
        refused.close()


def test_unreadable_certificate_fails_start_up(tmp_path):
    server = BridgeServer(
        SERVING,
        *DOOR,
        "--grpc-use-ssl",
        "true",
        f"--grpc-server-cert={tmp_path / 'missing.crt'}",
        f"--grpc-server-key={tmp_path / 'missing.key'}",
        log_path=tmp_path / "bridge.log",
    )
    with pytest.raises(RuntimeError, match="exited with code 1"):
        server.start()
    assert "--grpc-server-key: cannot read" in server.log_text


# -- statistics -----------------------------------------------------------------------------------


def _batch_one_runs(stats: dict) -> int:
    """Executions of batch size 1 in one model's statistics (0 when there is no such row)."""
    for row in stats.get("batch_stats", ()):
        if row["batch_size"] == "1":
            return int(row["compute_infer"].get("count", 0))
    return 0


def test_model_statistics_count_what_the_model_ran(dtypes: BridgeServer):
    """ModelStatistics sums the workers' per-version counters, in Triton's fields."""
    client = grpcclient.InferenceServerClient(dtypes.grpc_url)
    try:

        def stats() -> dict:
            return client.get_inference_statistics("identity_int8", as_json=True)["model_stats"]

        before = stats()
        assert [(s["name"], s["version"]) for s in before] == [("identity_int8", "1")]
        count = int(before[0].get("inference_count", 0))
        # The server is shared: earlier tests may have sent batches (counted per item above).
        successes = int(before[0]["inference_stats"].get("success", {}).get("count", 0))
        singles = _batch_one_runs(before[0])
        tensor = grpcclient.InferInput("INPUT0", [1, 2], "INT8")
        tensor.set_data_from_numpy(np.array([[1, 2]], np.int8))
        for _ in range(3):
            client.infer("identity_int8", [tensor])

        def counted() -> dict | None:
            # The worker records an execution just after it answers (as Triton does).
            (now,) = stats()
            return now if int(now.get("inference_count", 0)) >= count + 3 else None

        after = wait_until(counted, "the three requests in the statistics")
        assert int(after["inference_count"]) == count + 3
        assert int(after["inference_stats"]["success"]["count"]) == successes + 3
        assert after["inference_stats"]["cache_hit"] == {}  # present and empty, as Triton
        assert _batch_one_runs(after) == singles + 3
        with pytest.raises(InferenceServerException) as caught:
            client.get_inference_statistics("no_such_model")
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert caught.value.message() == "requested model 'no_such_model' is not available"
    finally:
        client.close()


# -- the in-process route (embedded default) -----------------------------------------------------


def endpoint_requests(metrics: str, model: str) -> int:
    """Requests Dynamo's request plane delivered to a model's `generate` endpoints (every
    generation), from a worker's system status server (`dynamo_component_requests_total`).
    Dynamo labels component `<slug>[-g<n>]-<hash>` (bridge/models/endpoint.py) with `_` for `-`."""
    component = re.compile(rf'dynamo_component="{re.escape(model)}(_g\d+)?_[0-9a-f]{{8}}"')
    total = 0
    for line in metrics.splitlines():
        labels, _, number = line.rpartition(" ")
        if (
            labels.startswith("dynamo_component_requests_total{")
            and 'dynamo_endpoint="generate"' in labels
            and component.search(labels)
        ):
            total += int(float(number))
    return total


def test_embedded_door_calls_its_own_worker_in_process(bridge_server, repository):
    """`--role all --frontend triton`: the door calls the process's own worker directly; the
    worker's request plane sees none of the requests its model answers (Dynamo's per-endpoint
    counter stays at zero while Triton's success counter counts them all)."""
    system_port = free_port(SYSTEM_PORTS)  # Dynamo 1.6.1 takes it as an i16
    server = bridge_server(
        repository("dtypes"),
        *DOOR,
        env={"DYN_SYSTEM_PORT": str(system_port), "DYN_SYSTEM_HOST": "127.0.0.1"},
    )
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for value in range(5):
            tensor = fp32_input([[float(value)] * 4])
            answer = client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0")
            assert answer.tolist() == [[value] * 4]
        stream_answers: list = []
        client.start_stream(callback=lambda result, error: stream_answers.append(error or result))
        client.async_stream_infer("identity_fp32", [fp32_input([[1.0] * 4])])
        client.stop_stream()
        assert [a.as_numpy("OUTPUT0").tolist() for a in stream_answers] == [[[1.0] * 4]]
    finally:
        client.close()
    assert success_count(http_text(server.metrics_url), "identity_fp32") == 6
    dynamo_metrics = http_text(f"http://127.0.0.1:{system_port}/metrics")
    assert "dynamo_component_requests_total" in dynamo_metrics  # the counter is there
    assert endpoint_requests(dynamo_metrics, "identity_fp32") == 0


# -- one frontend, two worker processes ----------------------------------------------------------


def success_count(metrics: str, model: str) -> int:
    prefix = f'nv_inference_request_success{{model="{model}",version="1"}} '
    line = next((line for line in metrics.splitlines() if line.startswith(prefix)), None)
    return int(float(line[len(prefix) :])) if line else 0


def int32(value: int) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("INPUT0", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], np.int32))
    return tensor


def test_frontend_and_two_workers_with_file_discovery(
    tmp_path, e2e_multi_a: Path, e2e_multi_b: Path
):
    """`--role frontend --frontend triton` finds both workers' models through file discovery,
    spreads a model both serve over both, and lets a stopped worker's models go."""
    env = {"DYN_FILE_KV": str(tmp_path / "kv")}
    servers: list[BridgeServer] = []
    try:
        workers = [
            Worker(root, env=env, log_path=tmp_path / f"worker-{root.name}.log")
            for root in (e2e_multi_a, e2e_multi_b)
        ]
        for server in workers:
            servers.append(server)
            server.start()
        frontend = Frontend(*DOOR, env=env, log_path=tmp_path / "frontend.log")
        servers.append(frontend)
        client = frontend.start().client()
        models = ("alpha", "beta", "common")
        wait_until(lambda: all(client.is_model_ready(m) for m in models), "every model")
        index = client.get_model_repository_index(as_json=True)["models"]
        assert [(m["name"], m["state"]) for m in index] == [(m, "READY") for m in models]
        for value, model in enumerate(models):
            assert client.infer(model, [int32(value)]).as_numpy("OUTPUT0").tolist() == [value]
        for value in range(8):
            client.infer("common", [int32(value)])
        # Both workers answered some of `common`'s requests (round robin over instances).
        counts = [success_count(http_text(w.metrics_url), "common") for w in workers]
        assert sum(counts) == 9 and min(counts) > 0, counts

        workers[1].process.send_signal(signal.SIGTERM)
        assert workers[1].process.wait(WAIT_S) == 0
        wait_until(lambda: not client.is_model_ready("beta"), "beta to leave")
        with pytest.raises(InferenceServerException) as caught:
            client.infer("beta", [int32(1)])
        # Its last worker left: UNAVAILABLE, which clients retry, for the departed grace
        # (tests/e2e/test_rolling_restart.py follows it to NOT_FOUND).
        assert caught.value.status() == "StatusCode.UNAVAILABLE"
        assert client.infer("common", [int32(5)]).as_numpy("OUTPUT0").tolist() == [5]
        assert client.is_server_ready()
    finally:
        for server in servers:
            server.stop()


# -- system shared memory -------------------------------------------------------------------------


def test_system_shared_memory(dtypes: BridgeServer):
    """Inputs read from, and outputs written to, regions the client registered; Triton's
    answers for a duplicate name, an unknown region, a span past the region's end."""
    client = grpcclient.InferenceServerClient(dtypes.grpc_url)
    key_in, key_out = f"/door_in_{os.getpid()}", f"/door_out_{os.getpid()}"
    region_in = shm.create_shared_memory_region("in", key_in, 64)
    region_out = shm.create_shared_memory_region("out", key_out, 64)
    try:
        array = np.arange(4, dtype=np.float32).reshape(1, 4)
        shm.set_shared_memory_region(region_in, [array])
        client.register_system_shared_memory("in", key_in, 64)
        client.register_system_shared_memory("out", key_out, 64)
        status = client.get_system_shared_memory_status(as_json=True)["regions"]
        assert status["in"] == {"name": "in", "key": key_in, "byte_size": "64"}
        with pytest.raises(InferenceServerException, match="'in' already in manager"):
            client.register_system_shared_memory("in", key_in, 64)

        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_shared_memory("in", 16)
        output = grpcclient.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory("out", 16)
        result = client.infer("identity_fp32", [tensor], outputs=[output])
        assert result.get_response().raw_output_contents == [b""]
        np.testing.assert_array_equal(
            shm.get_contents_as_numpy(region_out, np.float32, [1, 4]), array
        )

        past_end = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        past_end.set_shared_memory("in", 16, offset=60)
        with pytest.raises(InferenceServerException) as caught:
            client.infer("identity_fp32", [past_end])
        assert caught.value.message() == "Invalid offset + byte size for shared memory region: 'in'"
        unknown = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        unknown.set_shared_memory("nope", 16)
        with pytest.raises(InferenceServerException) as caught:
            client.infer("identity_fp32", [unknown])
        assert caught.value.status() == "StatusCode.NOT_FOUND"
        assert caught.value.message() == "Unable to find shared memory region: 'nope'"
    finally:
        client.unregister_system_shared_memory()
        assert client.get_system_shared_memory_status(as_json=True) == {}
        client.close()
        shm.destroy_shared_memory_region(region_in)
        shm.destroy_shared_memory_region(region_out)


# -- restricted protocols -------------------------------------------------------------------------


def test_restricted_protocol(bridge_server):
    """Restricted groups answer only calls with their header; the others stay open."""
    server = bridge_server(
        SERVING, *DOOR, "--grpc-restricted-protocol=inference,statistics:infer-key=s3cret"
    )
    client = server.client()
    assert client.is_server_ready()  # health is not restricted
    expected = "This protocol is restricted, expecting header 'infer-key'"
    for headers in (None, {"infer-key": "wrong"}):
        with pytest.raises(InferenceServerException) as caught:
            client.infer("echo", [fp32_input([1.0])], headers=headers)
        assert (caught.value.status(), caught.value.message()) == (
            "StatusCode.UNAVAILABLE",
            expected,
        )
    with pytest.raises(InferenceServerException, match=expected):
        client.get_inference_statistics()
    answers: list = []
    # The stream is refused when it opens, before any request on it.
    client.start_stream(callback=lambda result, error: answers.append(error))
    wait_until(lambda: answers, "the stream's refusal")
    client.stop_stream()
    assert expected in str(answers[0])
    result = client.infer("echo", [fp32_input([2.0])], headers={"infer-key": "s3cret"})
    assert result.as_numpy("OUTPUT0").tolist() == [2.0]


def test_restricted_protocol_needs_a_known_group(tmp_path):
    server = BridgeServer(
        SERVING,
        *DOOR,
        "--grpc-restricted-protocol=inferences:k=v",
        log_path=tmp_path / "bridge.log",
    )
    with pytest.raises(RuntimeError, match="exited with code 2"):
        server.start()
    assert "unknown restricted protocol 'inferences'" in server.log_text


# -- load and unload -----------------------------------------------------------------------------


def test_load_and_unload_reach_the_worker(bridge_server, shared_bridge_server):
    """RepositoryModelLoad/Unload go to the worker, which applies its control mode's rules."""
    server = bridge_server(SERVING, *DOOR, "--model-control-mode=explicit", "--load-model=echo")
    client = server.client()
    assert not client.is_model_ready("pool")
    client.load_model("pool")
    assert client.is_model_ready("pool")
    assert client.infer("pool", [fp32_input([3.0])]).as_numpy("OUTPUT0").tolist() == [3.0]
    client.unload_model("pool")
    wait_until(lambda: not client.is_model_ready("pool"), "pool unloaded")
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("no_such_model")
    assert (caught.value.status(), caught.value.message()) == (
        "StatusCode.INTERNAL",
        "failed to load 'no_such_model', failed to poll from model repository",
    )
    polling = shared_bridge_server(SERVING, *DOOR).client()
    with pytest.raises(InferenceServerException) as caught:
        polling.unload_model("echo")
    assert (caught.value.status(), caught.value.message()) == (
        "StatusCode.UNAVAILABLE",
        "explicit model load / unload is not allowed if polling is enabled",
    )


# -- hot reload ------------------------------------------------------------------------------------


class InferOnly(threading.Thread):
    """`marked` asked again and again with ModelInfer only (no readiness calls, which would
    refresh the door's index on their own): the marks seen, and any error."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.client = grpcclient.InferenceServerClient(url)
        self.marks: list[int] = []
        self.errors: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                self.marks.append(ask_marked(self.client)[0])
            except InferenceServerException as exc:
                self.errors.append(str(exc))

    def stop(self) -> None:
        self.done.set()
        self.join(WAIT_S)
        self.client.close()


def test_hot_reload_under_traffic(bridge_server, tmp_path):
    """A reloaded model is served on a new endpoint (a new generation); the door follows it
    with no failed request, and the old generation is withdrawn once quiet, not after the
    drain's 60 s bound."""
    repo = copy_models(tmp_path, "marked")
    server = bridge_server(
        repo, *DOOR, "--reload-debounce-secs", "0.2", env={"RELOAD_LOAD_LOG": str(tmp_path / "l")}
    )
    model_py = repo / "marked" / "1" / "model.py"
    traffic = InferOnly(server.grpc_url)
    traffic.start()
    try:
        wait_until(lambda: traffic.marks[-1:] == [1], "version 1 answering")
        for mark in (2, 3):
            set_line(model_py, "MARK = ", f"MARK = {mark}")
            wait_until(lambda: traffic.marks[-1:] == [mark], f"version {mark} answering")  # noqa: B023
            unloaded = f"successfully unloaded 'marked' (generation {mark - 1})"
            wait_until(lambda: unloaded in server.log_text, "the old generation unloaded")  # noqa: B023
            answered = len(traffic.marks)
            wait_until(lambda: len(traffic.marks) > answered + 20, "answers after the swap")  # noqa: B023
    finally:
        traffic.stop()
    assert traffic.errors == []
    assert traffic.marks[-20:] == [3] * 20
