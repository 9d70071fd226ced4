"""Request validation against what real Triton 2.51 answered to the same requests.

Every expected message, status and model-side shape comes from fixtures/validation_oracle.json,
captured from the real server by fixtures/capture_validation.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from bridge.frontends.triton.grpc.error_status import GRPC_STATUS_NAMES
from model_repository_loader import pb_utils
from model_repository_loader.pb_utils.constants import DATATYPE_TO_NUMPY
from model_repository_loader.validation import (
    RequestError,
    RequestValidator,
    config_datatype_name,
    no_available_versions_error,
    parse_model_version,
    triton_input_order,
    unknown_model_error,
)

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "validation_oracle.json").read_text())
CASES = FIXTURE["cases"]


def _validator(model: str) -> RequestValidator:
    config = text_format.Parse(FIXTURE["models"][model], mc.ModelConfig())
    return RequestValidator(config)


VALIDATORS = {name: _validator(name) for name in FIXTURE["models"]}


def _tensor(name: str, datatype: str, shape: list[int]) -> pb_utils.Tensor:
    """A request tensor as the bridge's codec builds it (stored form of the datatype)."""
    if datatype == "BYTES":
        array = np.full(shape, b"ab", dtype=np.object_)
    else:
        array = np.zeros(shape, dtype=DATATYPE_TO_NUMPY[datatype])
    return pb_utils.Tensor._from_wire(name, array, datatype)


def _inputs(case: dict) -> list[pb_utils.Tensor]:
    return [_tensor(name, datatype, shape) for name, datatype, shape in case["inputs"]]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_validator_matches_triton(case: dict) -> None:
    validator = VALIDATORS[case["model"]]
    expected = case["expected"]
    inputs = _inputs(case)
    request_id = case.get("request_id", "")
    if expected["status"] != "OK":
        with pytest.raises(RequestError) as info:
            validator.validate(request_id, inputs, case["outputs"])
        assert str(info.value) == expected["message"]
        assert GRPC_STATUS_NAMES[info.value.code] == expected["status"]
        return
    batch = validator.validate(request_id, inputs, case["outputs"])
    if validator.batching:
        assert batch == case["inputs"][0][2][0]
    else:
        assert batch == 1
    if "model_shapes" in expected:
        seen = {t.name(): t.shape() for t in validator.apply_input_reshape(inputs)}
        assert seen == expected["model_shapes"]
        shapes = {name: validator.model_shape(name, shape) for name, _, shape in case["inputs"]}
        assert shapes == expected["model_shapes"]


def test_fixture_covers_every_rule() -> None:
    """The capture must keep exercising each rule; a shrunken fixture would hide regressions."""
    messages = " ".join(c["expected"].get("message", "") for c in CASES)
    for fragment in (
        "but missing required input(s) ['",
        "but missing required input(s) ]",
        "expected number of inputs between",
        "unexpected inference input",
        "already exists in request",
        "data-type is",
        "unexpected shape for input",
        "NOTE: Setting a non-zero max_batch_size",
        "batch-size must be <=",
        "batch size does not match",
        "has no shape but model requires batch dimension",
        "input byte size mismatch",
        "string elements for inference input",
        "unexpected inference output",
    ):
        assert fragment in messages, fragment
    assert any("model_shapes" in c["expected"] for c in CASES)


LOOKUPS = {lookup["id"]: lookup["expected"] for lookup in FIXTURE["lookups"]}


def test_model_lookup_texts_match_triton() -> None:
    """The lookup texts the bridge and BLS answer with, as Triton words them."""
    assert unknown_model_error("nope") == LOOKUPS["unknown_model"]["message"]
    assert unknown_model_error("nope", None) == LOOKUPS["unknown_model_with_version"]["message"]
    assert unknown_model_error("two_in", 3) == LOOKUPS["unknown_version"]["message"]
    assert unknown_model_error("two_in", 0) == LOOKUPS["version_zero"]["message"]
    assert no_available_versions_error("broken") == LOOKUPS["no_available_versions"]["message"]


@pytest.mark.parametrize(
    ("case", "parsed"),
    [
        ("version_negative", None),
        ("version_not_a_number", None),
        ("version_out_of_range", None),
        ("version_with_spaces_and_junk", 1),
        ("version_with_plus", 1),
        ("unknown_version", 3),
        ("version_zero", 0),
    ],
)
def test_model_version_strings_parse_as_triton_reads_them(case: str, parsed: int | None) -> None:
    """`parse_model_version` (the bridge form's and the triton door's version field)."""
    version = next(c["version"] for c in FIXTURE["lookups"] if c["id"] == case)
    if parsed is not None:
        assert parse_model_version(version) == parsed
        return
    with pytest.raises(RequestError) as info:
        parse_model_version(version)
    assert str(info.value) == LOOKUPS[case]["message"]
    assert GRPC_STATUS_NAMES[info.value.code] == LOOKUPS[case]["status"]


def test_an_empty_model_version_is_the_servers_choice() -> None:
    assert parse_model_version("") == -1


# -- behaviour that needs no oracle -------------------------------------------------------------


def test_request_error_code_builds_a_triton_error() -> None:
    error = RequestError("boom")
    triton_error = pb_utils.TritonError(str(error), error.code)
    assert triton_error.code() == pb_utils.TritonError.INVALID_ARG
    assert GRPC_STATUS_NAMES[error.code] == "INVALID_ARGUMENT"


def test_message_helpers() -> None:
    # Texts from spec §3.4 [V] (also in the oracle fixture's lookups).
    assert unknown_model_error("m") == "Request for unknown model: 'm' is not found"
    assert unknown_model_error("m", -1) == "Request for unknown model: 'm' is not found"
    assert unknown_model_error("m", "") == "Request for unknown model: 'm' is not found"
    assert unknown_model_error("m", 4) == "Request for unknown model: 'm' version 4 is not found"


def test_config_datatype_names() -> None:
    assert config_datatype_name(mc.TYPE_STRING) == "BYTES"
    assert config_datatype_name(mc.TYPE_BF16) == "BF16"
    assert config_datatype_name(mc.TYPE_FP32) == "FP32"


def test_input_order_is_reverse_insertion_for_distinct_buckets() -> None:
    # From the oracle: inputs sent as INPUT0, INPUT1, INPUT9 are listed INPUT9, INPUT1, INPUT0.
    assert triton_input_order(("INPUT0", "INPUT1", "INPUT9")) == ("INPUT9", "INPUT1", "INPUT0")
    assert triton_input_order(()) == ()


def test_valid_request_has_no_side_effects_on_inputs() -> None:
    validator = VALIDATORS["reshape"]
    inputs = [_tensor("A", "FP32", [2, 2, 2]), _tensor("B", "FP32", [2, 1])]
    inputs.append(_tensor("C", "FP32", [2, 3, 4]))
    before = [t.shape() for t in inputs]
    assert validator.validate("", inputs) == 2
    reshaped = validator.apply_input_reshape(inputs)
    assert [t.shape() for t in inputs] == before
    assert [t.shape() for t in reshaped] == [[2, 4], [2], [2, 3, 2, 2]]
    # A view: no copy of the request data.
    assert np.shares_memory(reshaped[0].as_numpy(), inputs[0].as_numpy())


def test_no_reshape_returns_same_list() -> None:
    validator = VALIDATORS["two_in"]
    inputs = [_tensor("INPUT0", "FP32", [4]), _tensor("INPUT1", "FP32", [4])]
    assert validator.apply_input_reshape(inputs) is inputs
