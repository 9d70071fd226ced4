"""Request validation against the model config: Triton's texts inside the bridge's errors.

Dynamo's frontend checks none of this (spec dynamo_runtime §2); the bridge must, with Triton's
words. Difference `error_status` applies: INVALID_ARGUMENT on Triton is INTERNAL with the
`InvalidRequest` category on the bridge.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.differential.support import (
    Failure,
    Pair,
    both,
    expected_bridge_error,
    expected_bridge_unknown_model,
    fp32_input,
    int32_input,
    is_triton_unknown_model,
    make_input,
    requested,
)

pytestmark = pytest.mark.oracle


# id → (repository fixture, model, inputs factory, infer keyword arguments)
CASES = {
    "missing-only-input": ("dtypes", "identity_fp32", lambda: [], {}),
    "missing-required-input": (
        "introspect",
        "optional_input",
        lambda: [],
        {},
    ),
    "unknown-input-beside-known": (
        "dtypes",
        "identity_fp32",
        lambda: [fp32_input([[1.0]]), fp32_input([[1.0]], "BOGUS")],
        {},
    ),
    "unknown-input-alone": ("dtypes", "identity_fp32", lambda: [fp32_input([[1.0]], "BOGUS")], {}),
    "unknown-input-with-optional": (
        "introspect",
        "optional_input",
        lambda: [fp32_input([1.0], "REQUIRED"), fp32_input([1.0], "OPT_C")],
        {},
    ),
    "duplicate-input": (
        "dtypes",
        "identity_fp32",
        lambda: [fp32_input([[1.0]]), fp32_input([[2.0]])],
        {},
    ),
    "wrong-datatype": ("dtypes", "identity_fp32", lambda: [int32_input([[1]])], {}),
    "wrong-datatype-fp16": (
        "dtypes",
        "identity_fp32",
        lambda: [make_input("INPUT0", np.ones((1, 2), np.float16), "FP16")],
        {},
    ),
    "wrong-datatype-bytes": (
        "dtypes",
        "identity_int64",
        lambda: [make_input("INPUT0", np.array([[b"1"]], np.object_), "BYTES")],
        {},
    ),
    "wrong-datatype-request-id": (
        "dtypes",
        "identity_fp32",
        lambda: [int32_input([[1]])],
        {"request_id": "req-42"},
    ),
    "wrong-rank-batched": (
        "dtypes",
        "identity_fp32",
        lambda: [fp32_input(np.ones((1, 2, 3)))],
        {},
    ),
    "wrong-rank-nobatch": ("dtypes", "identity_fp32_nobatch", lambda: [fp32_input([1.0])], {}),
    "scalar-on-batched": ("dtypes", "identity_fp32", lambda: [fp32_input(1.0)], {}),
    "wrong-fixed-dim": ("introspect", "pb_names", lambda: [int32_input([1, 2])], {}),
    "wrong-fixed-dims-batched": (
        "introspect",
        "reshape",
        lambda: [fp32_input(np.ones((1, 2, 3)), "MATRIX"), fp32_input([[1.0]], "SCALAR")],
        {},
    ),
    "batch-over-max": ("dtypes", "identity_fp32", lambda: [fp32_input(np.ones((9, 2)))], {}),
    "batch-over-max-bytes": (
        "dtypes",
        "identity_bytes",
        lambda: [make_input("INPUT0", np.full((9, 1), b"x", np.object_), "BYTES")],
        {},
    ),
    "unknown-requested-output": (
        "dtypes",
        "identity_fp32",
        lambda: [fp32_input([[1.0]])],
        {"outputs": requested("NOPE")},
    ),
    "unknown-requested-output-beside-known": (
        "introspect",
        "request_info",
        lambda: [fp32_input([1.0])],
        {"outputs": requested("INFO", "NOPE")},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_validation_text_matches(request, case: str):
    fixture, model, inputs, kwargs = CASES[case]
    pair: Pair = request.getfixturevalue(fixture)
    triton, bridge = both(pair, lambda c: c.infer(model, inputs(), **kwargs))
    assert isinstance(triton, Failure), triton
    assert triton.status == "StatusCode.INVALID_ARGUMENT", triton
    assert bridge == expected_bridge_error(triton)


def test_unknown_model(dtypes: Pair):
    triton, bridge = both(dtypes, lambda c: c.infer("no_such_model", [fp32_input([[1.0]])]))
    assert is_triton_unknown_model(triton, "no_such_model"), triton
    assert bridge == expected_bridge_unknown_model("no_such_model", triton)
