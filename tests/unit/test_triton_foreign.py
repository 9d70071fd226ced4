"""The door's conversions for foreign TensorBased workers (bridge/frontends/triton/foreign.py)
and the model cards it reads (model_cards.py), on the card a real worker wrote (file backend,
ai-dynamo-runtime 1.6.1)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from bridge.codec import TO_DYNAMO, decode_tensor
from bridge.frontends.triton.foreign import bridge_items, to_list, to_raw, to_standard_request
from bridge.frontends.triton.model_cards import parse_card

ARRAYS = {
    "BOOL": np.array([True, False, True]),
    "UINT8": np.array([0, 255], np.uint8),
    "UINT64": np.array([0, 2**64 - 1], np.uint64),
    "INT8": np.array([-128, 127], np.int8),
    "INT32": np.array([-(2**31), 7], np.int32),
    "INT64": np.array([-(2**63), 2**63 - 1], np.int64),
    "FP16": np.array([1.5, -0.0, np.inf], np.float16),
    "FP32": np.array([1.5, -2.25, np.nan], np.float32),
    "FP64": np.array([1e300, -1e-300], np.float64),
}


@pytest.mark.parametrize("datatype", sorted(ARRAYS))
def test_raw_to_list_is_what_the_bridge_codec_reads(datatype):
    """The list form decodes (with the bridge's own standard-form decoder) to the same array,
    and converts back to the same raw contents."""
    array = ARRAYS[datatype]
    raw = array.view(np.uint16).tobytes() if datatype == "FP16" else array.tobytes()
    values = to_list(datatype, raw)
    tensor = {
        "metadata": {"name": "X", "data_type": TO_DYNAMO[datatype], "shape": [len(array)]},
        "data": {"data_type": TO_DYNAMO[datatype], "values": values},
    }
    decoded = decode_tensor(tensor).as_numpy()
    np.testing.assert_array_equal(decoded, array)
    assert to_raw(datatype, values) == raw


def test_bytes_both_ways():
    elements = [b"", b"a\x00b", "é".encode()]
    raw = b"".join(len(e).to_bytes(4, "little") + e for e in elements)
    assert to_list("BYTES", raw) == [list(e) for e in elements]
    assert to_raw("BYTES", [list(e) for e in elements]) == raw
    assert to_raw("BYTES", elements) == raw  # workers may answer bytes objects


def test_standard_request_has_no_bridge_keys():
    body = {
        "model": "m",
        "bridge_form": 1,
        "model_version": "",
        "id": "r",
        "tensors": [
            {
                "metadata": {"name": "X", "data_type": "Int32", "shape": [2]},
                "data": {"data_type": "Int32", "values": np.array([1, 2], np.int32).tobytes()},
            }
        ],
    }
    out = to_standard_request(body)
    assert "bridge_form" not in out and "model_version" not in out and out["id"] == "r"
    assert out["tensors"][0]["data"]["values"] == [1, 2]


def _answer(value: int, final: bool | None = None) -> dict:
    answer = {
        "model": "m",
        "tensors": [
            {
                "metadata": {"name": "Y", "data_type": "Int32", "shape": [1]},
                "data": {"data_type": "Int32", "values": [value]},
            }
        ],
    }
    if final is not None:
        answer["parameters"] = {"triton_final_response": {"bool": final}}
    return answer


async def _items(answers, error: Exception | None = None) -> list[dict]:
    async def stream():
        for answer in answers:
            yield answer
        if error is not None:
            raise error

    return [item async for item in bridge_items(stream(), "m")]


def test_the_last_answer_is_final():
    items = asyncio.run(_items([_answer(1), _answer(2)]))
    assert [(i["final"], i["tensors"][0]["data"]["values"]) for i in items] == [
        (False, np.array([1], np.int32).tobytes()),
        (True, np.array([2], np.int32).tobytes()),
    ]
    assert all(i["model_version"] == "1" for i in items)


def test_a_stream_with_no_answer_ends_with_a_flag_only_final():
    assert asyncio.run(_items([])) == [
        {"model": "m", "model_version": "", "tensors": [], "final": True, "empty": True}
    ]


def test_a_failed_stream_ends_with_an_internal_error_item():
    items = asyncio.run(_items([_answer(1)], RuntimeError("model broke")))
    assert items[0]["final"] is False
    assert items[1] == {"error": {"code": "INTERNAL", "message": "model broke"}, "final": True}


# A card as ai-dynamo-runtime 1.6.1 writes it (file backend, echo worker; shortened config).
CARD = {
    "type": "Model",
    "namespace": "ns",
    "component": "echo-identity-fp32",
    "endpoint": "generate",
    "instance_id": 3240187916823757053,
    "card_json": {
        "display_name": "identity_fp32",
        "model_type": "TensorBased",
        "model_input": "Tensor",
        "tensor_model_config": {
            "name": "identity_fp32",
            "inputs": [{"name": "INPUT0", "data_type": "Float32", "shape": [-1]}],
            "outputs": [{"name": "OUTPUT0", "data_type": "Float32", "shape": [-1]}],
            "triton_model_config": [10, 13, *b"identity_fp32", 18, 6, *b"python"],
        },
    },
}


def test_card_with_triton_config():
    name, endpoint, config = parse_card(json.dumps(CARD), "ns")
    assert (name, endpoint) == ("identity_fp32", "ns.echo-identity-fp32.generate")
    assert config.name == "identity_fp32" and config.platform == "python"


def test_card_without_triton_config_builds_one_from_its_tensors():
    card = json.loads(json.dumps(CARD))
    del card["card_json"]["tensor_model_config"]["triton_model_config"]
    _, _, config = parse_card(json.dumps(card), "ns")
    assert [(t.name, list(t.dims)) for t in config.input] == [("INPUT0", [-1])]
    assert config.output[0].data_type == 11  # TYPE_FP32


def test_cards_of_other_namespaces_and_kinds_are_skipped():
    assert parse_card(json.dumps(CARD), "other") is None
    card = json.loads(json.dumps(CARD))
    card["card_json"]["model_type"] = "Chat"
    assert parse_card(json.dumps(card), "ns") is None
    assert parse_card("not json", "ns") is None
