"""Malformed KServe requests, sent raw: which shapes of bad input get no prompt answer?

Every case is a `ModelInferRequest` built with tritonclient's `service_pb2`, so nothing on the
client side checks it. Each is sent once over ModelInfer and once over ModelStreamInfer, with a
deadline of `--deadline` seconds, and its outcome is recorded: `ok`, the gRPC status and message,
or `TIMEOUT` (no answer before the deadline: the defect this script looks for). A good request
after all of them shows the server is unharmed.

The triton door's HTTP port gets HTTP_CASES, written as raw bytes on a socket (what a web page,
a rebinding attacker or a broken client sends: foreign origins, non-JSON labels, bodies over
`--http-max-input-size`, decompression bombs, nesting past 100, lone surrogates), each with the
status it must get (`UNEXPECTED` otherwise); a good infer follows. The server that this script
starts for them runs under a memory limit, so a bomb that is inflated fails instead of filling
the machine.

    python -m benchmarks.fuzz_malformed                 # starts a bridge on REPOSITORIES
    python -m benchmarks.fuzz_malformed --port 8001     # or talk to a running server
    python -m benchmarks.fuzz_malformed --http-port 8000  # and its triton door's HTTP port

Bounded: one request at a time, each with its deadline; about 2 × len(CASES) + len(HTTP_CASES)
requests.
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import socket
import struct
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
# tests/repositories served, written out whole by tests/harness/repositories.py's `materialize`
# (some of their models keep only a config.pbtxt and share another model's model.py).
REPOSITORIES = ["dtypes", "sequence", "streaming", "batching"]

FP32 = "identity_fp32"  # INPUT0 FP32 [-1], max_batch_size 8: shape [batch, n]
FP32_NOBATCH = "identity_fp32_nobatch"  # INPUT0 FP32 [-1, -1]
BYTES = "identity_bytes_nobatch"  # INPUT0 BYTES [-1, -1]
BOOL = "identity_bool_nobatch"
FP16 = "identity_fp16"
BF16 = "identity_bf16"
SEQUENCE = "seq_direct"  # INPUT IN INT32 [1], max_batch_size 4, sequence batcher (direct)
DECOUPLED = "repeat"  # IN INT32 [-1], decoupled


def _int32(*values: int) -> bytes:
    return np.array(values, dtype=np.int32).tobytes()


def _seq(**parameters: pb.InferParameter) -> pb.ModelInferRequest:
    return _request(SEQUENCE, [_tensor("IN", "INT32", [1, 1])], [_int32(1)], parameters=parameters)


def _fp32_with(**parameters: pb.InferParameter) -> pb.ModelInferRequest:
    return _request(FP32, [_tensor()], [_fp32(4)], parameters=parameters)


def _request(
    model: str,
    inputs: list[pb.ModelInferRequest.InferInputTensor],
    raw: list[bytes] | None = None,
    **fields: object,
) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, inputs=inputs, **fields)
    if raw is not None:
        request.raw_input_contents.extend(raw)
    return request


def _tensor(
    name: str = "INPUT0", datatype: str = "FP32", shape: list[int] | None = None, **fields: object
) -> pb.ModelInferRequest.InferInputTensor:
    return pb.ModelInferRequest.InferInputTensor(
        name=name, datatype=datatype, shape=[1, 4] if shape is None else shape, **fields
    )


def _fp32(n: int) -> bytes:
    return np.arange(n, dtype=np.float32).tobytes()


def _bytes_elements(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def _contents(**values: list) -> pb.InferTensorContents:
    return pb.InferTensorContents(**values)


def _param(**value: object) -> pb.InferParameter:
    return pb.InferParameter(**value)


def good() -> pb.ModelInferRequest:
    return _request(FP32, [_tensor()], [_fp32(4)])


# name → a request. Each one is wrong in one way.
CASES: dict[str, Callable[[], pb.ModelInferRequest]] = {
    "raw_too_short": lambda: _request(FP32, [_tensor()], [_fp32(3)]),
    "raw_too_long": lambda: _request(FP32, [_tensor()], [_fp32(5)]),
    "raw_not_multiple_of_item": lambda: _request(FP32, [_tensor()], [b"\0" * 7]),
    "raw_empty_shape_nonzero": lambda: _request(FP32, [_tensor()], [b""]),
    "negative_dim": lambda: _request(FP32, [_tensor(shape=[1, -4])], [_fp32(4)]),
    "negative_batch": lambda: _request(FP32, [_tensor(shape=[-1, 4])], [_fp32(4)]),
    "huge_shape": lambda: _request(FP32, [_tensor(shape=[1, 1 << 40])], [_fp32(4)]),
    "overflow_shape": lambda: _request(FP32, [_tensor(shape=[1 << 62, 1 << 62])], [_fp32(4)]),
    "huge_shape_contents": lambda: _request(
        FP32, [_tensor(shape=[1, 1 << 40], contents=_contents(fp32_contents=[1.0]))]
    ),
    "zero_dims_with_data": lambda: _request(FP32, [_tensor(shape=[1, 0])], [_fp32(4)]),
    "no_shape": lambda: _request(FP32, [_tensor(shape=[])], [_fp32(1)]),
    "too_many_dims": lambda: _request(FP32, [_tensor(shape=[1] * 40)], [_fp32(1)]),
    "batch_over_max": lambda: _request(FP32, [_tensor(shape=[9, 1])], [_fp32(9)]),
    "missing_input": lambda: _request(FP32, []),
    "missing_data": lambda: _request(FP32, [_tensor()]),
    "raw_and_contents": lambda: _request(
        FP32, [_tensor(contents=_contents(fp32_contents=[1, 2, 3, 4]))], [_fp32(4)]
    ),
    "contents_count_short": lambda: _request(
        FP32, [_tensor(contents=_contents(fp32_contents=[1, 2, 3]))]
    ),
    "contents_count_long": lambda: _request(
        FP32, [_tensor(contents=_contents(fp32_contents=[1, 2, 3, 4, 5]))]
    ),
    "contents_wrong_field": lambda: _request(
        FP32, [_tensor(contents=_contents(int_contents=[1, 2, 3, 4]))]
    ),
    "contents_two_fields": lambda: _request(
        FP32,
        [_tensor(contents=_contents(fp32_contents=[1, 2, 3, 4], int_contents=[1, 2, 3, 4]))],
    ),
    "bad_datatype": lambda: _request(FP32, [_tensor(datatype="FP33")], [_fp32(4)]),
    "empty_datatype": lambda: _request(FP32, [_tensor(datatype="")], [_fp32(4)]),
    "lowercase_datatype": lambda: _request(FP32, [_tensor(datatype="fp32")], [_fp32(4)]),
    "datatype_mismatch": lambda: _request(FP32, [_tensor(datatype="INT32")], [_fp32(4)]),
    "datatype_mismatch_bytes": lambda: _request(
        FP32, [_tensor(datatype="BYTES", shape=[1, 1])], [_bytes_elements(b"abcd")]
    ),
    "duplicate_input": lambda: _request(FP32, [_tensor(), _tensor()], [_fp32(4), _fp32(4)]),
    "unknown_input": lambda: _request(FP32, [_tensor(name="NOPE")], [_fp32(4)]),
    "empty_input_name": lambda: _request(FP32, [_tensor(name="")], [_fp32(4)]),
    "extra_raw": lambda: _request(FP32, [_tensor()], [_fp32(4), _fp32(4)]),
    "raw_for_some_inputs": lambda: _request(FP32, [_tensor(), _tensor(name="INPUT1")], [_fp32(4)]),
    "bytes_prefix_too_long": lambda: _request(
        BYTES, [_tensor(datatype="BYTES", shape=[1, 1])], [struct.pack("<I", 100) + b"abc"]
    ),
    "bytes_prefix_truncated": lambda: _request(
        BYTES, [_tensor(datatype="BYTES", shape=[1, 1])], [b"\x03\x00"]
    ),
    "bytes_count_short": lambda: _request(
        BYTES, [_tensor(datatype="BYTES", shape=[1, 3])], [_bytes_elements(b"a", b"b")]
    ),
    "bytes_count_long": lambda: _request(
        BYTES, [_tensor(datatype="BYTES", shape=[1, 1])], [_bytes_elements(b"a", b"b")]
    ),
    "bytes_trailing_garbage": lambda: _request(
        BYTES, [_tensor(datatype="BYTES", shape=[1, 1])], [_bytes_elements(b"a") + b"\x01"]
    ),
    "bytes_huge_prefix": lambda: _request(
        BYTES, [_tensor(datatype="BYTES", shape=[1, 1])], [b"\xff\xff\xff\xff"]
    ),
    "bytes_contents_count": lambda: _request(
        BYTES,
        [_tensor(datatype="BYTES", shape=[1, 3], contents=_contents(bytes_contents=[b"a"]))],
    ),
    "bool_raw_value_2": lambda: _request(
        BOOL, [_tensor(datatype="BOOL", shape=[1, 2])], [b"\x01\x02"]
    ),
    "fp16_odd_size": lambda: _request(FP16, [_tensor(datatype="FP16")], [b"\0" * 7]),
    "bf16_odd_size": lambda: _request(BF16, [_tensor(datatype="BF16")], [b"\0" * 7]),
    "unset_parameter": lambda: _request(
        FP32, [_tensor()], [_fp32(4)], parameters={"p": pb.InferParameter()}
    ),
    "unset_input_parameter": lambda: _request(
        FP32, [_tensor(parameters={"p": pb.InferParameter()})], [_fp32(4)]
    ),
    "uint64_parameter": lambda: _request(
        FP32, [_tensor()], [_fp32(4)], parameters={"p": _param(uint64_param=1 << 63)}
    ),
    "double_parameter_nan": lambda: _request(
        FP32, [_tensor()], [_fp32(4)], parameters={"p": _param(double_param=float("nan"))}
    ),
    "empty_final_as_string": lambda: _request(
        FP32,
        [_tensor()],
        [_fp32(4)],
        parameters={"triton_enable_empty_final_response": _param(string_param="yes")},
    ),
    "shared_memory_input": lambda: _request(
        FP32,
        [_tensor(parameters={"shared_memory_region": _param(string_param="r")})],
    ),
    "binary_data_size_param": lambda: _request(
        FP32, [_tensor(parameters={"binary_data_size": _param(int64_param=16)})], [_fp32(4)]
    ),
    "sequence_id_string_on_plain": lambda: _request(
        FP32, [_tensor()], [_fp32(4)], parameters={"sequence_id": _param(string_param="x")}
    ),
    "unknown_output": lambda: _request(
        FP32,
        [_tensor()],
        [_fp32(4)],
        outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="NOPE")],
    ),
    "empty_output_name": lambda: _request(
        FP32,
        [_tensor()],
        [_fp32(4)],
        outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="")],
    ),
    "duplicate_output": lambda: _request(
        FP32,
        [_tensor()],
        [_fp32(4)],
        outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="OUTPUT0")] * 2,
    ),
    "empty_model_name": lambda: _request("", [_tensor()], [_fp32(4)]),
    "unknown_model": lambda: _request("nope", [_tensor()], [_fp32(4)]),
    "bad_version": lambda: _request(FP32, [_tensor()], [_fp32(4)], model_version="abc"),
    "missing_version": lambda: _request(FP32, [_tensor()], [_fp32(4)], model_version="7"),
    "id_nul_ansi_10k": lambda: _request(
        FP32, [_tensor(name="IN\0\x1b[31m")], [_fp32(4)], id="\0\x1b[31m" + "x" * 10_000
    ),
    "nobatch_wrong_rank": lambda: _request(FP32_NOBATCH, [_tensor(shape=[4])], [_fp32(4)]),
    # Reserved request parameters (Triton's names) with the wrong type or value.
    "timeout_string": lambda: _fp32_with(timeout=_param(string_param="soon")),
    "timeout_double_nan": lambda: _fp32_with(timeout=_param(double_param=float("nan"))),
    "timeout_double_inf": lambda: _fp32_with(timeout=_param(double_param=float("inf"))),
    "timeout_negative": lambda: _fp32_with(timeout=_param(int64_param=-5)),
    "timeout_bool": lambda: _fp32_with(timeout=_param(bool_param=True)),
    "priority_string": lambda: _fp32_with(priority=_param(string_param="high")),
    "priority_negative": lambda: _fp32_with(priority=_param(int64_param=-1)),
    "sequence_start_string": lambda: _fp32_with(sequence_start=_param(string_param="no")),
    "seq_no_id": lambda: _seq(sequence_start=_param(bool_param=True)),
    "seq_id_string": lambda: _seq(
        sequence_id=_param(string_param="s1"), sequence_start=_param(bool_param=True)
    ),
    "seq_id_empty_string": lambda: _seq(
        sequence_id=_param(string_param=""), sequence_start=_param(bool_param=True)
    ),
    "seq_id_double": lambda: _seq(
        sequence_id=_param(double_param=1.5), sequence_start=_param(bool_param=True)
    ),
    "seq_id_bool": lambda: _seq(
        sequence_id=_param(bool_param=True), sequence_start=_param(bool_param=True)
    ),
    "seq_id_negative": lambda: _seq(
        sequence_id=_param(int64_param=-7), sequence_start=_param(bool_param=True)
    ),
    "seq_id_uint64_max": lambda: _seq(
        sequence_id=_param(uint64_param=(1 << 64) - 1), sequence_start=_param(bool_param=True)
    ),
    "seq_start_string": lambda: _seq(
        sequence_id=_param(int64_param=8), sequence_start=_param(string_param="true")
    ),
    "seq_start_int": lambda: _seq(
        sequence_id=_param(int64_param=9), sequence_start=_param(int64_param=1)
    ),
    "seq_not_started": lambda: _seq(sequence_id=_param(int64_param=10)),
    "seq_end_only": lambda: _seq(
        sequence_id=_param(int64_param=11), sequence_end=_param(bool_param=True)
    ),
    "seq_batch_2": lambda: _request(
        SEQUENCE,
        [_tensor("IN", "INT32", [2, 1])],
        [_int32(1, 2)],
        parameters={
            "sequence_id": _param(int64_param=12),
            "sequence_start": _param(bool_param=True),
        },
    ),
    "seq_timeout_string": lambda: _seq(
        sequence_id=_param(int64_param=13),
        sequence_start=_param(bool_param=True),
        sequence_end=_param(bool_param=True),
        timeout=_param(string_param="x"),
    ),
    # A batch of zero requests' worth of rows: every dimension agrees with no data at all.
    "zero_batch": lambda: _request(FP32, [_tensor(shape=[0, 4])], [b""]),
    "zero_batch_huge_dim": lambda: _request(FP32, [_tensor(shape=[0, 1 << 40])], [b""]),
    "zero_batch_dynamic": lambda: _request("dyn_no_delay", [_tensor("IN", "INT32", [0, 1])], [b""]),
    "zero_batch_preferred": lambda: _request(
        "dyn_preferred", [_tensor("IN", "INT32", [0, 1])], [b""]
    ),
    "zero_batch_stacked": lambda: _request("stacked", [_tensor("IN", "INT32", [0, 1])], [b""]),
    "zero_batch_sequence": lambda: _request(
        SEQUENCE,
        [_tensor("IN", "INT32", [0, 1])],
        [b""],
        parameters={
            "sequence_id": _param(int64_param=14),
            "sequence_start": _param(bool_param=True),
        },
    ),
    "decoupled_negative_count": lambda: _request(
        DECOUPLED, [_tensor("IN", "INT32", [1])], [_int32(-3)]
    ),
    "decoupled_empty_input": lambda: _request(DECOUPLED, [_tensor("IN", "INT32", [0])], [b""]),
    "decoupled_timeout_string": lambda: _request(
        DECOUPLED,
        [_tensor("IN", "INT32", [1])],
        [_int32(1)],
        parameters={"timeout": _param(string_param="x")},
    ),
}


def _with_invalid_utf8_id() -> bytes:
    # Field 3 (id), a string, holding bytes that are not UTF-8: only a raw client sends this.
    return good().SerializeToString() + b"\x1a\x02\xff\xfe"


# name → raw bytes sent as a ModelInferRequest (wire-level damage no generated client makes).
WIRE_CASES: dict[str, Callable[[], bytes]] = {
    "wire_garbage": lambda: b"\xff\x00garbage\x13",
    "wire_truncated": lambda: good().SerializeToString()[:-3],
    "wire_invalid_utf8_id": _with_invalid_utf8_id,
    "wire_empty": lambda: b"",
}


# -- HTTP (the triton door) ------------------------------------------------------------------

MAX_INPUT = 1 << 26  # the door's default --http-max-input-size (Triton's)
_INFER = f"/v2/models/{FP32}/infer"
_GOOD = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
).encode()
_PAGE = {"Origin": "https://attacker.example"}
_FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def _infer_json(name: str = "INPUT0", data: bytes = b"[1,2]", extra: bytes = b"") -> bytes:
    return (
        b'{"inputs":[{"name":"' + name.encode("latin-1") + b'","shape":[1,2],"datatype":"FP32",'
        b'"data":' + data + b"}]" + extra + b"}"
    )


def _http(
    method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> bytes:
    """A request as bytes; `Content-Length` from the body unless the headers give one."""
    given = {"Host": "127.0.0.1", **(headers or {})}
    if body and "Transfer-Encoding" not in given:
        given.setdefault("Content-Length", str(len(body)))
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in given.items())
    return head.encode("latin-1") + b"Connection: close\r\n\r\n" + body


def _chunked(total: int) -> bytes:
    chunk = b" " * (1 << 20)
    count = total // len(chunk) + 1
    framed = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
    return framed * count + b"0\r\n\r\n"


def _bomb(encoding: str) -> bytes:
    zeros = b"\0" * (1 << 30)  # 1 GB inflated, about 1 MB sent
    return gzip.compress(zeros, 9) if encoding == "gzip" else zlib.compress(zeros, 9)


# name → (the request's bytes, the status it must get).
HTTP_CASES: dict[str, Callable[[], tuple[bytes, int]]] = {
    "http_page_text_plain_infer": lambda: (
        _http("POST", _INFER, _GOOD, {**_PAGE, "Content-Type": "text/plain"}),
        403,
    ),
    "http_page_form_logging": lambda: (
        _http("POST", "/v2/logging", b'{"log_info":false}', {**_PAGE, **_FORM}),
        403,
    ),
    "http_page_multipart_load": lambda: (
        _http(
            "POST",
            "/v2/repository/models/x/load",
            b"{}",
            {**_PAGE, "Content-Type": "multipart/form-data; boundary=b"},
        ),
        403,
    ),
    "http_fetch_cross_site_shm": lambda: (
        _http(
            "POST",
            "/v2/systemsharedmemory/region/r/register",
            b'{"key":"/k","byte_size":8}',
            {"Sec-Fetch-Site": "cross-site", **_FORM},
        ),
        403,
    ),
    "http_null_origin_trace": lambda: (
        _http("POST", "/v2/trace/setting", b"{}", {"Origin": "null"}),
        403,
    ),
    "http_text_plain_generate": lambda: (
        _http("POST", f"/v2/models/{FP32}/generate", b"{}", {"Content-Type": "text/plain"}),
        415,
    ),
    "http_rebinding_host": lambda: (
        _http("GET", "/v2/health/live", b"", {"Host": "evil.example"}),
        403,
    ),
    "http_rebinding_origin_is_host": lambda: (
        _http("POST", _INFER, _GOOD, {"Host": "evil.example", "Origin": "http://evil.example"}),
        403,
    ),
    "http_content_length_over_limit": lambda: (
        _http("POST", _INFER, b"", {"Content-Length": str(MAX_INPUT + 1)}),
        400,
    ),
    "http_chunked_over_limit": lambda: (
        _http("POST", _INFER, _chunked(MAX_INPUT), {"Transfer-Encoding": "chunked"}),
        400,
    ),
    "http_gzip_bomb": lambda: (
        _http("POST", _INFER, _bomb("gzip"), {"Content-Encoding": "gzip"}),
        400,
    ),
    "http_deflate_bomb": lambda: (
        _http("POST", _INFER, _bomb("deflate"), {"Content-Encoding": "deflate"}),
        400,
    ),
    "http_gzip_cut_short": lambda: (
        _http("POST", _INFER, gzip.compress(_GOOD)[:-9], {"Content-Encoding": "gzip"}),
        400,
    ),
    "http_deep_json_infer": lambda: (_http("POST", _INFER, _infer_json(data=b"[" * 200_000)), 400),
    "http_deep_json_logging": lambda: (
        _http("POST", "/v2/logging", b'{"log_info":' + b"[" * 150 + b"]" * 150 + b"}"),
        400,
    ),
    "http_json_input_over_limit": lambda: (
        _http(
            "POST",
            _INFER,
            b'{"inputs":[{"name":"INPUT0","shape":[1,%d],"datatype":"FP32","data":[1]}]}'
            % (MAX_INPUT // 4 + 1),
        ),
        400,
    ),
    "http_surrogate_input_name": lambda: (_http("POST", _INFER, _infer_json("\\ud800")), 400),
    "http_surrogate_id_generate": lambda: (
        _http("POST", f"/v2/models/{FP32}/generate", b'{"id":"\\udfff","INPUT0":[1.0]}'),
        500,  # Triton's parse failure on every JSON route but infer (400 there)
    ),
    "http_not_utf8_input_name": lambda: (_http("POST", _INFER, _infer_json("IN\xff")), 400),
    "http_header_length_too_long": lambda: (
        _http("POST", _INFER, _GOOD, {"Inference-Header-Content-Length": "99999"}),
        400,
    ),
}


def send_http(port: int, request: bytes, deadline: float) -> tuple[str, str]:
    """(status or `TIMEOUT` / `closed`, the error text): one request on its own connection.
    The server may answer and close before a refused body is all sent."""
    with socket.create_connection(("127.0.0.1", port), timeout=deadline) as sock:
        try:
            sock.sendall(request)
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered early; the answer is still there to read
        answer = b""
        try:
            while data := sock.recv(1 << 16):
                answer += data
        except TimeoutError:
            return "TIMEOUT", ""
        except ConnectionResetError:
            pass
    if not answer:
        return "closed", ""
    head, _, body = answer.partition(b"\r\n\r\n")
    status = head.split(b" ", 2)[1].decode()
    try:
        text = json.loads(body.decode("utf-8", "surrogateescape")).get("error", "")
    except ValueError:
        text = body[:200].decode("utf-8", "replace")
    return status, str(text)


def run_http(port: int, deadline: float, names: list[str] | None = None) -> dict[str, tuple]:
    """Send each HTTP case once; {name: (outcome, detail, seconds)}, outcome `UNEXPECTED ...`
    when the status is not the one the case must get."""
    results: dict[str, tuple] = {}
    for name in [n for n in names if n in HTTP_CASES] if names else list(HTTP_CASES):
        request, expected = HTTP_CASES[name]()
        started = time.monotonic()
        status, detail = send_http(port, request, deadline)
        del request
        outcome = status if status in (str(expected), "TIMEOUT") else f"UNEXPECTED {status}"
        results[name] = (outcome, detail, time.monotonic() - started)
    good, _ = send_http(port, _http("POST", _INFER, _GOOD), deadline)
    results["http_good/after"] = ("ok" if good == "200" else good, "", 0.0)
    return results


def _memory_limit(pid: int, headroom: int = 768 << 20) -> None:
    """Cap the server's address space at what it has now plus `headroom` (soft limit)."""
    with open(f"/proc/{pid}/status") as status:
        size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    resource.prlimit(pid, resource.RLIMIT_AS, (size + headroom, resource.RLIM_INFINITY))


def send(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
    request: pb.ModelInferRequest,
    stream: bool,
    deadline: float,
) -> tuple[str, str]:
    """(outcome, detail): outcome is `ok`, a gRPC status name, `stream-error` or `TIMEOUT`."""
    try:
        if not stream:
            stub.ModelInfer(request, timeout=deadline)
            return "ok", ""
        for reply in stub.ModelStreamInfer(iter([request]), timeout=deadline):
            # One request, so the first reply is its answer (an error or a response).
            if reply.error_message:
                return "stream-error", reply.error_message
            return "ok", ""
        return "stream-closed", "no reply"
    except grpc.RpcError as error:
        if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            return "TIMEOUT", ""
        return error.code().name, error.details() or ""


def run(port: int, deadline: float, names: list[str] | None = None) -> dict[str, tuple]:
    """Send each case both ways; {name/mode: (outcome, detail, seconds)}."""
    channel = grpc.insecure_channel(
        f"localhost:{port}", options=[("grpc.max_send_message_length", 64 << 20)]
    )
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    results: dict[str, tuple] = {}
    for name in [n for n in names if n in CASES] if names else list(CASES):
        for stream in (False, True):
            started = time.monotonic()
            outcome, detail = send(stub, CASES[name](), stream, deadline)
            key = f"{name}/{'stream' if stream else 'unary'}"
            results[key] = (outcome, detail, time.monotonic() - started)
    raw_infer = channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=lambda data: data,
        response_deserializer=lambda data: data,
    )
    for name in WIRE_CASES if names is None else [n for n in names if n in WIRE_CASES]:
        started = time.monotonic()
        try:
            raw_infer(WIRE_CASES[name](), timeout=deadline)
            outcome, detail = "ok", ""
        except grpc.RpcError as error:
            timed_out = error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            outcome, detail = ("TIMEOUT", "") if timed_out else (error.code().name, error.details())
        results[f"{name}/unary"] = (outcome, detail or "", time.monotonic() - started)
    results["good/after"] = (*send(stub, good(), False, deadline), 0.0)
    channel.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, help="a running server's gRPC port")
    parser.add_argument("--http-port", type=int, help="a running triton door's HTTP port")
    parser.add_argument("--deadline", type=float, default=5.0, help="seconds per request")
    parser.add_argument("cases", nargs="*", help="only these cases (default: all)")
    args = parser.parse_args(argv)
    servers = []
    port, http_port = args.port, args.http_port
    folder = tempfile.TemporaryDirectory(prefix="fuzz-malformed-")
    if port is None:
        sys.path.insert(0, str(ROOT))
        from tests.harness.bridge_server import BridgeServer
        from tests.harness.repositories import materialize

        roots = [materialize(name, Path(folder.name)) for name in REPOSITORIES]
        more = [arg for path in roots[1:] for arg in ("--model-repository", str(path))]
        servers.append(BridgeServer(roots[0], *more, "--model-control-mode", "none"))
        servers[-1].start()
        port = servers[-1].grpc_port
        # The HTTP cases need the triton door (the server above runs the default one).
        door = BridgeServer(roots[0], "--frontend", "triton")
        servers.append(door)
        door.start()
        http_port = door.http_port
        assert door.process is not None
        _memory_limit(door.process.pid)
    try:
        results = run(port, args.deadline, args.cases or None)
        if http_port is not None:
            results |= run_http(http_port, args.deadline, args.cases or None)
    finally:
        for server in servers:
            server.stop()
        folder.cleanup()
    width = max(map(len, results))
    for key, (outcome, detail, seconds) in results.items():
        print(f"{key:<{width}}  {outcome:<16} {seconds:5.2f}s  {detail[:110]!r}")
    waited = [key for key, (outcome, *_) in results.items() if outcome == "TIMEOUT"]
    wrong = [key for key, (outcome, *_) in results.items() if outcome.startswith("UNEXPECTED")]
    print(f"\n{len(waited)} of {len(results)} got no answer within {args.deadline:g} s: {waited}")
    if wrong:
        print(f"{len(wrong)} HTTP cases got another status than Triton's: {wrong}")
    unharmed = all(results[k][0] == "ok" for k in ("good/after", "http_good/after") if k in results)
    return 1 if waited or wrong or not unharmed else 0


if __name__ == "__main__":
    sys.exit(main())
