"""Large BYTES inputs on the triton door (issue 22, finding 4): what they cost, their limits, and
that other models are served meanwhile.

A request of millions of one-byte strings once cost ~50 times its size (per-element Python
objects for the framing, on the event loop, then again for the answer). Here the server runs
under an address-space limit set once it is up (`prlimit` on its pid: its size then plus a
budget the old code overran), and its peak RSS growth (`VmHWM`, reset through `clear_refs`) is
bounded to a small multiple of the payload. The model must still get what Triton's stub gives
it (`count_bytes` checks: a 1-D object array of `bytes`).
"""

from __future__ import annotations

import resource
import struct
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.support import REPOSITORIES, BackgroundInfer, Gate, fp32_input, wait_until

REPOSITORY = REPOSITORIES / "bytes_limits"
DOOR = ("--frontend", "triton")
ELEMENTS = 3_000_000  # one-byte strings: 15 MB serialized (a 4-byte length each)
PAYLOAD = 5 * ELEMENTS
# What the server may grow by while one such request goes in and back out, in multiples of the
# payload. Measured: peak RSS 12x over gRPC, 6x over HTTP (gRPC's buffers, the protobufs, the
# bridge form each way, an 8-byte pointer per element); address space 8x and 3x. The old code:
# ~50x, and a MemoryError under this address-space budget.
MAX_RSS_GROWTH = 16
ADDRESS_SPACE_BUDGET = 20


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _limit_address_space(pid: int, budget: int) -> None:
    """The server may map `budget` bytes more than it has now; past that, allocations fail."""
    limit = _status_kib(pid, "VmSize") * 1024 + budget
    resource.prlimit(pid, resource.RLIMIT_AS, (limit, limit))


def _reset_peak(pid: int) -> int:
    """Reset the peak RSS (VmHWM) to the current RSS; returns it, in bytes."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return _status_kib(pid, "VmHWM") * 1024


def _strings(count: int) -> np.ndarray:
    return np.full(count, b"x", dtype=np.object_)


def _grpc_bytes(values: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("INPUT0", list(values.shape), "BYTES")
    tensor.set_data_from_numpy(values)
    return tensor


def _http_bytes(values: np.ndarray) -> httpclient.InferInput:
    tensor = httpclient.InferInput("INPUT0", list(values.shape), "BYTES")
    tensor.set_data_from_numpy(values, binary_data=True)
    return tensor


def _serve_small(server) -> None:
    result = server.client().infer("small", [fp32_input([1.5, 2.5])])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.array([1.5, 2.5], np.float32))


def _warm_up(server) -> None:
    # Big enough to start every thread a large request uses (their stacks and heaps are mapped
    # once, on first use), small enough to cost nothing under the limit set afterwards.
    result = server.client().infer("count_bytes", [_grpc_bytes(_strings(100_000))])
    assert result.as_numpy("COUNT").tolist() == [100_000]
    _serve_small(server)


def _big_grpc_client(server) -> grpcclient.InferenceServerClient:
    # tritonclient's channel takes answers of up to 4 MiB unless told otherwise.
    return grpcclient.InferenceServerClient(
        server.grpc_url, channel_args=[("grpc.max_receive_message_length", 256 << 20)]
    )


@pytest.mark.parametrize("wire", ["grpc", "http"])
def test_millions_of_one_byte_strings_cost_a_small_multiple_of_their_size(bridge_server, wire):
    """In and back out through an identity model (the answer's framing was the old code's
    worst part): served under the address-space limit, with a bounded peak RSS."""
    server = bridge_server(REPOSITORY, *DOOR)
    _warm_up(server)
    pid = server.process.pid
    _limit_address_space(pid, ADDRESS_SPACE_BUDGET * PAYLOAD)
    before = _reset_peak(pid)
    values = _strings(ELEMENTS)
    if wire == "grpc":
        client = _big_grpc_client(server)
        try:
            result = client.infer("identity_bytes", [_grpc_bytes(values)], client_timeout=120)
        finally:
            client.close()
    else:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
        try:
            output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
            result = client.infer("identity_bytes", [_http_bytes(values)], outputs=[output])
        finally:
            client.close()
    growth = _status_kib(pid, "VmHWM") * 1024 - before
    out = result.as_numpy("OUTPUT0")
    assert out.shape == (ELEMENTS,)
    assert out[0] == b"x" and out[-1] == b"x"
    assert growth <= MAX_RSS_GROWTH * PAYLOAD, f"peak RSS grew {growth >> 20} MiB"
    _serve_small(server)  # and the server goes on


def test_varied_strings_come_back_unchanged(bridge_server):
    """Elements of many lengths (the walk that is not one numpy pass), past the size decoded off
    the event loop, through a model that returns them: the same bytes, in order."""
    server = bridge_server(REPOSITORY, *DOOR)
    values = np.array([b"\x00ab"[: i % 4] + bytes([i % 256]) * (i % 7) for i in range(200_000)])
    values = values.astype(np.object_)
    client = _big_grpc_client(server)
    try:
        result = client.infer("identity_bytes", [_grpc_bytes(values)], client_timeout=120)
    finally:
        client.close()
    out = result.as_numpy("OUTPUT0")
    assert out.dtype == np.object_
    assert out.tolist() == values.tolist()


def _refusal(server, wire: str, values: np.ndarray) -> tuple[str, str]:
    """(status, text) of a refused count_bytes request."""
    if wire == "grpc":
        with pytest.raises(InferenceServerException) as caught:
            server.client().infer("count_bytes", [_grpc_bytes(values)])
        return str(caught.value.status()), caught.value.message()
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    try:
        with pytest.raises(InferenceServerException) as caught:
            client.infer("count_bytes", [_http_bytes(values)])
    finally:
        client.close()
    return str(caught.value.status()), caught.value.message()


@pytest.mark.parametrize("wire", ["grpc", "http"])
def test_more_elements_than_the_cap_are_refused_invalid_arg(bridge_server, wire):
    server = bridge_server(REPOSITORY, *DOOR, "--max-bytes-elements", "1000")
    status, text = _refusal(server, wire, _strings(1001))
    assert status == ("StatusCode.INVALID_ARGUMENT" if wire == "grpc" else "400")
    assert text == (
        "[request id: <id_unknown>] inference request for model 'count_bytes' has 1001 BYTES "
        "elements, more than the 1000 this server accepts (--max-bytes-elements)"
    )
    result = server.client().infer("count_bytes", [_grpc_bytes(_strings(1000))])
    assert result.as_numpy("COUNT").tolist() == [1000]
    _serve_small(server)


def test_more_than_the_decoded_size_cap_is_refused_invalid_arg(bridge_server):
    # Set through the environment form of the flag.
    server = bridge_server(REPOSITORY, *DOOR, env={"DYN_BRIDGE_MAX_BYTES_DECODED_SIZE": "5099"})
    # 100 ten-byte strings: 8 + 33 + 10 bytes each once decoded, 5100 in all.
    status, text = _refusal(server, "grpc", np.full(100, b"0123456789", dtype=np.object_))
    assert status == "StatusCode.INVALID_ARGUMENT"
    assert text == (
        "[request id: <id_unknown>] inference request for model 'count_bytes' has 5100 bytes of "
        "BYTES inputs once decoded, more than the 5099 this server accepts "
        "(--max-bytes-decoded-size)"
    )
    result = server.client().infer("count_bytes", [_grpc_bytes(_strings(600))])  # 4800 bytes
    assert result.as_numpy("COUNT").tolist() == [600]


def test_a_broken_large_bytes_input_gets_tritons_text(bridge_server):
    """The framing of a large input is walked off the event loop, with Triton's texts."""
    server = bridge_server(REPOSITORY, *DOOR)
    elements = [struct.pack("<I", i % 5) + b"z" * (i % 5) for i in range(100_000)]
    raw = b"".join(elements) + b"zz"  # a cut length prefix at the end
    tensor = grpcclient.InferInput("INPUT0", [100_000], "BYTES")
    tensor._raw_content = raw  # tritonclient frames BYTES itself: cut short on purpose
    with pytest.raises(InferenceServerException) as caught:
        server.client().infer("count_bytes", [tensor])
    assert str(caught.value.status()) == "StatusCode.INVALID_ARGUMENT"
    assert caught.value.message() == (
        "[request id: <id_unknown>] incomplete string length indicator for inference input "
        "'INPUT0' for model 'count_bytes', expecting 4 bytes but only 2 bytes available. "
        "Please make sure the string length indicator is in one buffer."
    )
    _serve_small(server)


def test_a_small_request_is_answered_while_big_bytes_requests_are_in_flight(
    bridge_server, tmp_path
):
    """Four big BYTES requests held in the model (a gate file): a small request to another
    model is answered while they are in flight, and they all complete afterwards."""
    server = bridge_server(REPOSITORY, *DOOR)
    client = server.client()
    gate = Gate(tmp_path)
    tags = [f"big{i}" for i in range(4)]
    bigs = {
        tag: BackgroundInfer(
            client,
            "count_bytes",
            [_grpc_bytes(_strings(1_000_000))],
            parameters=gate.params(tag),
            client_timeout=120,
        )
        for tag in tags
    }
    try:
        wait_until(lambda: any(gate.started(t) for t in tags), "a big request in the model")
        _serve_small(server)
        assert not any(call.done() for call in bigs.values())
    finally:
        gate.open()
    for call in bigs.values():
        assert call.result(timeout=120).as_numpy("COUNT").tolist() == [1_000_000]


def test_dynamos_door_meets_the_cap_on_the_worker(bridge_server):
    """Dynamo's frontend hands the worker BYTES as lists: the worker refuses past the cap too."""
    server = bridge_server(REPOSITORY, "--frontend", "dynamo", "--max-bytes-elements", "1000")
    server.wait_model_ready("count_bytes")
    with pytest.raises(InferenceServerException) as caught:
        server.client().infer("count_bytes", [_grpc_bytes(_strings(1001))])
    assert "has 1001 BYTES elements, more than the 1000 this server accepts" in str(caught.value)
    result = server.client().infer("count_bytes", [_grpc_bytes(_strings(1000))])
    assert result.as_numpy("COUNT").tolist() == [1000]


def test_grpc_max_message_size_refuses_a_larger_request(bridge_server):
    server = bridge_server(REPOSITORY, *DOOR, "--grpc-max-message-size", str(1 << 20))
    with pytest.raises(InferenceServerException) as caught:
        server.client().infer("count_bytes", [_grpc_bytes(_strings(300_000))])  # 1.5 MB
    assert str(caught.value.status()) == "StatusCode.RESOURCE_EXHAUSTED"
    result = server.client().infer("count_bytes", [_grpc_bytes(_strings(100_000))])
    assert result.as_numpy("COUNT").tolist() == [100_000]


@pytest.mark.parametrize("host_id", ["", "none"], ids=["shared memory", "bytes form"])
def test_bytes_answers_cross_the_request_plane(tmp_path, host_id):
    """Issue 38 finding 7: a BYTES answer is framed into one bytearray, which only the
    in-process door may keep; from a worker in another process (through a shared memory region,
    inline below its threshold, or in the bytes form over Dynamo's request plane, whose msgpack
    refuses a bytearray) it arrives whole, large and small, on both wires. Its input, decoded
    only when the model reads it, is the model's as it was sent."""
    from tests.harness.roles import Frontend, Worker

    env = {"DYN_FILE_KV": str(tmp_path / "kv")}
    worker_env = {**env, "DYN_BRIDGE_SHM_HOST_ID": host_id} if host_id else env
    worker = Worker(REPOSITORY, env=worker_env, log_path=tmp_path / "worker.log")
    frontend = Frontend(*DOOR, env=env, log_path=tmp_path / "frontend.log")
    try:
        worker.start()
        frontend.start()
        grpc_client = grpcclient.InferenceServerClient(frontend.grpc_url)
        wait_until(lambda: grpc_client.is_model_ready("identity_bytes"), "identity_bytes")
        http_client = httpclient.InferenceServerClient(frontend.http_url)
        for count in (3, 40_000):  # inline; past the region threshold (128 KiB)
            data = np.array([b"%d" % i * (i % 7) for i in range(count)], dtype=np.object_)
            for client, module in ((grpc_client, grpcclient), (http_client, httpclient)):
                tensor = module.InferInput("INPUT0", [count], "BYTES")
                tensor.set_data_from_numpy(data)
                answer = client.infer("identity_bytes", [tensor]).as_numpy("OUTPUT0")
                assert answer.tolist() == data.tolist(), (count, module.__name__)
    finally:
        frontend.stop()
        worker.stop()
