"""Malformed KServe requests, sent raw: which shapes of bad input get no prompt answer?

Every case is a `ModelInferRequest` built with tritonclient's `service_pb2`, so nothing on the
client side checks it. Each is sent once over ModelInfer and once over ModelStreamInfer, with a
deadline of `--deadline` seconds, and its outcome is recorded: `ok`, the gRPC status and message,
or `TIMEOUT` (no answer before the deadline: the defect this script looks for). A good request
after all of them shows the server is unharmed.

    python -m benchmarks.fuzz_malformed                 # starts a bridge on REPOSITORIES
    python -m benchmarks.fuzz_malformed --port 8001     # or talk to a running server

Bounded: one request at a time, each with its deadline; about 2 × len(CASES) requests.
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
REPOSITORIES = [
    ROOT / "tests" / "repositories" / "dtypes",
    ROOT / "tests" / "repositories" / "sequence",
    ROOT / "tests" / "repositories" / "streaming",
    ROOT / "tests" / "repositories" / "batching",
]

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
    parser.add_argument("--deadline", type=float, default=5.0, help="seconds per request")
    parser.add_argument("cases", nargs="*", help="only these cases (default: all)")
    args = parser.parse_args(argv)
    server = None
    port = args.port
    if port is None:
        sys.path.insert(0, str(ROOT))
        from tests.harness.bridge_server import BridgeServer

        more = [arg for path in REPOSITORIES[1:] for arg in ("--model-repository", str(path))]
        server = BridgeServer(REPOSITORIES[0], *more, "--model-control-mode", "none").start()
        port = server.grpc_port
    try:
        results = run(port, args.deadline, args.cases or None)
    finally:
        if server is not None:
            server.stop()
    width = max(map(len, results))
    for key, (outcome, detail, seconds) in results.items():
        print(f"{key:<{width}}  {outcome:<16} {seconds:5.2f}s  {detail[:110]!r}")
    waited = [key for key, (outcome, *_) in results.items() if outcome == "TIMEOUT"]
    print(f"\n{len(waited)} of {len(results)} got no answer within {args.deadline:g} s: {waited}")
    return 1 if waited or results["good/after"][0] != "ok" else 0


if __name__ == "__main__":
    sys.exit(main())
