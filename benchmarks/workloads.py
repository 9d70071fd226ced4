"""The benchmark workloads: one prebuilt raw KServe request each, and a check of every answer.

Requests are serialized once, with their tensors in `raw_input_contents`, so the client spends
no time building them. Every response is checked against the expected output bytes (computed
here with numpy, not taken from any server), so a fast wrong answer counts as an error.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from tritonclient.grpc import service_pb2

# Response check: None when the answer is right, else a short reason.
Check = Callable[[service_pb2.ModelInferResponse], "str | None"]


@dataclass(frozen=True)
class Workload:
    """One row of the benchmark: a model, a request for it, and what a right answer holds."""

    name: str
    model: str
    description: str
    request: bytes  # a serialized ModelInferRequest
    expected: dict[str, bytes] = field(repr=False)  # output name → raw output bytes
    stream_responses: int = 0  # > 0: ModelStreamInfer, with this many responses per request
    # Streaming: every request of a turn on one shared ModelStreamInfer call (each with an id of
    # its own), instead of a stream per request.
    shared_stream: bool = False

    @property
    def streaming(self) -> bool:
        return self.stream_responses > 0

    def check(self, response: service_pb2.ModelInferResponse) -> str | None:
        """None if `response` carries exactly the expected outputs, else why not."""
        outputs = response.outputs
        raws = response.raw_output_contents
        if len(raws) != len(outputs):
            return f"{len(outputs)} outputs but {len(raws)} raw contents"
        if len(outputs) != len(self.expected):
            return f"expected {len(self.expected)} outputs, got {len(outputs)}"
        for tensor, raw in zip(outputs, raws, strict=True):
            want = self.expected.get(tensor.name)
            if want is None:
                return f"unexpected output '{tensor.name}'"
            if raw != want:
                return f"output '{tensor.name}' differs ({len(raw)} bytes, expected {len(want)})"
        return None

    def check_stream(self, index: int, response: service_pb2.ModelInferResponse) -> str | None:
        """The `index`-th streamed response must carry OUT = index."""
        if len(response.raw_output_contents) != 1:
            return f"response {index}: {len(response.raw_output_contents)} raw outputs"
        if response.raw_output_contents[0] != struct.pack("<i", index):
            return f"response {index}: wrong value"
        return None


def _request(model: str, inputs: list[tuple[str, str, np.ndarray | bytes, list[int]]]) -> bytes:
    request = service_pb2.ModelInferRequest(model_name=model)
    for name, datatype, data, shape in inputs:
        tensor = request.inputs.add()
        tensor.name = name
        tensor.datatype = datatype
        tensor.shape.extend(shape)
        request.raw_input_contents.append(data if isinstance(data, bytes) else data.tobytes())
    return request.SerializeToString()


def _bytes_element(payload: bytes) -> bytes:
    # KServe raw BYTES: each element is a 4-byte little-endian length, then the bytes.
    return struct.pack("<I", len(payload)) + payload


def _identity_fp32(name: str, count: int, description: str) -> Workload:
    data = np.random.default_rng(count).standard_normal(count).astype(np.float32)
    return Workload(
        name,
        "identity_fp32",
        description,
        _request("identity_fp32", [("INPUT0", "FP32", data, [count])]),
        {"OUTPUT0": data.tobytes()},
    )


def _identity_bytes(name: str, size: int, description: str) -> Workload:
    raw = _bytes_element(np.random.default_rng(size).bytes(size))
    return Workload(
        name,
        "identity_bytes",
        description,
        _request("identity_bytes", [("INPUT0", "BYTES", raw, [1])]),
        {"OUTPUT0": raw},
    )


def _add_sub(name: str, count: int, description: str) -> Workload:
    rng = np.random.default_rng(7)
    a = rng.standard_normal(count).astype(np.float32)
    b = rng.standard_normal(count).astype(np.float32)
    return Workload(
        name,
        "add_sub",
        description,
        _request("add_sub", [("INPUT0", "FP32", a, [count]), ("INPUT1", "FP32", b, [count])]),
        {"OUTPUT0": (a + b).tobytes(), "OUTPUT1": (a - b).tobytes()},
    )


def _stream(name: str, responses: int, description: str, shared: bool = False) -> Workload:
    count = np.array([responses], dtype=np.int32)
    return Workload(
        name,
        "stream_100",
        description,
        _request("stream_100", [("COUNT", "INT32", count, [1])]),
        {},
        stream_responses=responses,
        shared_stream=shared,
    )


_BUILDERS: dict[str, Callable[[], Workload]] = {
    "fp32_4": lambda: _identity_fp32("fp32_4", 4, "identity FP32 × 4"),
    "fp32_1k": lambda: _identity_fp32("fp32_1k", 1024, "identity FP32 × 1,024"),
    "fp32_100k": lambda: _identity_fp32("fp32_100k", 100_000, "identity FP32 × 100,000"),
    # 1,000,000 FP32 (4 MB) still fits Dynamo 1.6's 4 MiB request cap; 2^20 would not.
    "fp32_1m": lambda: _identity_fp32("fp32_1m", 1_000_000, "identity FP32 × 1,000,000"),
    "bytes_1k": lambda: _identity_bytes("bytes_1k", 1024, "identity BYTES, 1 × 1 KiB"),
    "bytes_1m": lambda: _identity_bytes("bytes_1m", 1 << 20, "identity BYTES, 1 × 1 MiB"),
    "add_sub": lambda: _add_sub("add_sub", 1024, "add_sub, 2 × FP32 × 1,024 in and out"),
    "stream_100": lambda: _stream("stream_100", 100, "decoupled, 100 responses per request"),
    # Dynamo 1.6's frontend runs the requests of one stream one at a time; Triton does not.
    "stream_100_shared": lambda: _stream(
        "stream_100_shared", 100, "decoupled, 100 responses per request, one shared stream", True
    ),
}

WORKLOAD_NAMES: tuple[str, ...] = tuple(_BUILDERS)


def build_workload(name: str) -> Workload:
    """The workload called `name` (one of WORKLOAD_NAMES)."""
    try:
        return _BUILDERS[name]()
    except KeyError:
        raise ValueError(f"unknown workload '{name}'; known: {', '.join(WORKLOAD_NAMES)}") from None
