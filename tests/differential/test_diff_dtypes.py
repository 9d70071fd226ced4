"""Identity models, one per datatype: the bridge must answer exactly what Triton answers.

The whole ModelInferResponse is compared (names, datatypes, shapes, raw bytes, id, version), and
the output must equal the input bit for bit. Inputs go as raw (binary) data: Dynamo's frontend
takes FP16/BF16 only that way.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from tests.differential.support import (
    Failure,
    Pair,
    both,
    expected_bridge_error,
    make_input,
    summarize,
)

pytestmark = pytest.mark.oracle

# KServe datatype → (numpy dtype, batched identity model)
NUMERIC = {
    "BOOL": (np.bool_, "identity_bool"),
    "UINT8": (np.uint8, "identity_uint8"),
    "UINT16": (np.uint16, "identity_uint16"),
    "UINT32": (np.uint32, "identity_uint32"),
    "UINT64": (np.uint64, "identity_uint64"),
    "INT8": (np.int8, "identity_int8"),
    "INT16": (np.int16, "identity_int16"),
    "INT32": (np.int32, "identity_int32"),
    "INT64": (np.int64, "identity_int64"),
    "FP16": (np.float16, "identity_fp16"),
    "FP32": (np.float32, "identity_fp32"),
    "FP64": (np.float64, "identity_fp64"),
    "BF16": (ml_dtypes.bfloat16, "identity_bf16"),
}

# Arbitrary bytes: empty, NUL inside, non-UTF-8, multi-byte UTF-8, a long element.
BYTES_VALUES = [b"", b"a\x00b", b"\x00", b"\xff\xfe\x80", "wörld ✓".encode(), b"x" * 1000]


def extremes(dtype: type) -> list:
    """Min, max and the awkward values of a datatype."""
    if dtype is np.bool_:
        return [True, False, True, False]
    if np.issubdtype(np.dtype(dtype), np.integer):
        info = np.iinfo(dtype)
        return [info.min, info.max, 0, 1, info.max - 1, info.min + 1]
    info = ml_dtypes.finfo(dtype) if dtype is ml_dtypes.bfloat16 else np.finfo(dtype)
    return [
        float(info.min),
        float(info.max),
        0.0,
        -0.0,
        float(info.tiny),
        float(info.smallest_subnormal),
        math.inf,
        -math.inf,
        math.nan,
        1.5,
    ]


def cases() -> list:
    out = []
    for datatype, (dtype, model) in NUMERIC.items():
        values = np.array(extremes(dtype), dtype=dtype)
        out.append(pytest.param(model, values.reshape(1, -1), datatype, id=f"{model}-extremes"))
        out.append(
            pytest.param(model, np.stack([values, values[::-1]]), datatype, id=f"{model}-b2")
        )
        out.append(pytest.param(model, np.zeros((1, 0), dtype), datatype, id=f"{model}-empty"))
    # The BF16 model that goes through a DLPack capsule.
    bf16 = np.array(extremes(ml_dtypes.bfloat16), dtype=ml_dtypes.bfloat16).reshape(1, -1)
    out.append(pytest.param("identity_bf16_capsule", bf16, "BF16", id="identity_bf16_capsule"))
    # Batch of 8 = max_batch_size.
    out.append(
        pytest.param(
            "identity_int32",
            np.arange(24, dtype=np.int32).reshape(8, 3),
            "INT32",
            id="identity_int32-max-batch",
        )
    )
    # BYTES, batched.
    strings = np.array(BYTES_VALUES, dtype=np.object_)
    out.append(pytest.param("identity_bytes", strings.reshape(1, -1), "BYTES", id="bytes"))
    out.append(
        pytest.param("identity_bytes", np.stack([strings, strings[::-1]]), "BYTES", id="bytes-b2")
    )
    out.append(
        pytest.param("identity_bytes", np.empty((1, 0), np.object_), "BYTES", id="bytes-empty")
    )
    # Without batching: dims [-1, -1], any 2-D shape including empty ones.
    nobatch = {
        "identity_bool_nobatch": ("BOOL", np.bool_),
        "identity_int64_nobatch": ("INT64", np.int64),
        "identity_fp32_nobatch": ("FP32", np.float32),
    }
    for model, (datatype, dtype) in nobatch.items():
        values = np.array(extremes(dtype), dtype=dtype)
        out.append(pytest.param(model, values.reshape(2, -1), datatype, id=f"{model}-2d"))
        out.append(pytest.param(model, np.zeros((0, 3), dtype), datatype, id=f"{model}-0x3"))
        out.append(pytest.param(model, np.zeros((3, 0), dtype), datatype, id=f"{model}-3x0"))
    out.append(
        pytest.param(
            "identity_bytes_nobatch", strings.reshape(2, 3), "BYTES", id="bytes_nobatch-2d"
        )
    )
    out.append(
        pytest.param(
            "identity_bytes_nobatch",
            np.empty((0, 2), np.object_),
            "BYTES",
            id="bytes_nobatch-0x2",
        )
    )
    return out


def as_bytes(array: np.ndarray) -> list:
    """Values in a form where equality is bit equality (NaN == NaN, -0.0 != 0.0)."""
    if array.dtype == np.object_:
        return [bytes(v) for v in array.ravel()]
    return [array.dtype.str, array.shape, array.tobytes()]


@pytest.mark.parametrize(("model", "array", "datatype"), cases())
def test_identity_matches_triton(dtypes: Pair, model: str, array: np.ndarray, datatype: str):
    triton, bridge = both(dtypes, lambda c: c.infer(model, [make_input("INPUT0", array, datatype)]))
    assert not isinstance(triton, Failure), triton
    assert summarize(bridge) == summarize(triton)
    # The identity holds on both (so the comparison above compared the right thing).
    for result in (triton, bridge):
        output = result.as_numpy("OUTPUT0")
        if datatype == "BF16":  # tritonclient hands BF16 back as float32 values
            output = output.astype(ml_dtypes.bfloat16)
        assert as_bytes(output) == as_bytes(array)


def test_zero_batch_is_rejected_as_triton_rejects_it(dtypes: Pair):
    """A batched model refuses a [0, n] request (byte-size check); difference: error_status."""
    array = np.zeros((0, 3), np.float32)
    triton, bridge = both(
        dtypes, lambda c: c.infer("identity_fp32", [make_input("INPUT0", array, "FP32")])
    )
    assert isinstance(triton, Failure), triton
    assert bridge == expected_bridge_error(triton)


def test_bytes_output_from_python_objects(dtypes: Pair):
    """str, int, float and bytes elements of a BYTES output go out as Triton encodes them."""
    array = np.arange(6, dtype=np.int32)
    triton, bridge = both(
        dtypes, lambda c: c.infer("bytes_from_python", [make_input("INPUT0", array, "INT32")])
    )
    assert not isinstance(triton, Failure), triton
    assert summarize(bridge) == summarize(triton)
    assert triton.as_numpy("OUTPUT0")[0] == "héllo 0".encode()
