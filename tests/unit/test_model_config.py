"""pb_utils.ModelConfig (spec §1.11): merge rules and Triton's exact ValueError texts.

Texts marked [V] in the spec were captured from Triton 2.51 (also replayed end to end in
test_config_oracle.py); the others are those of Triton's triton_python_backend_utils.py.
"""

from __future__ import annotations

import json

import pytest

from model_repository_loader import pb_utils
from model_repository_loader.pb_utils.model_config import ModelConfig


def make(**fields) -> ModelConfig:
    base = {"name": "m", "max_batch_size": 0, "input": [], "output": []}
    base.update(fields)
    return ModelConfig(json.dumps(base))


def test_pb_utils_exports_the_class():
    assert pb_utils.ModelConfig is ModelConfig


def test_as_dict_is_the_live_dict():
    cfg = make()
    cfg.as_dict()["max_batch_size"] = 3
    assert cfg.as_dict()["max_batch_size"] == 3


def test_set_max_batch_size_may_raise_but_not_lower():
    cfg = make(max_batch_size=4)
    cfg.set_max_batch_size(4)
    cfg.set_max_batch_size(16)
    assert cfg.as_dict()["max_batch_size"] == 16
    with pytest.raises(ValueError) as info:
        cfg.set_max_batch_size(2)
    assert str(info.value) == (
        "configuration specified max_batch_size 16, but in auto-complete-config function for "
        "model 'm' specified max_batch_size 2"
    )


def test_set_dynamic_batching_adds_an_empty_block_once():
    cfg = make(dynamic_batching={"max_queue_delay_microseconds": 5})
    cfg.set_dynamic_batching()
    assert cfg.as_dict()["dynamic_batching"] == {"max_queue_delay_microseconds": 5}
    fresh = make()
    fresh.set_dynamic_batching()
    assert fresh.as_dict()["dynamic_batching"] == {}


@pytest.mark.parametrize("other", ["sequence_batching", "ensemble_scheduling"])
def test_set_dynamic_batching_refuses_another_scheduler(other):
    cfg = make(**{other: {}})
    with pytest.raises(ValueError) as info:
        cfg.set_dynamic_batching()
    assert str(info.value) == (
        f"Configuration specified scheduling_choice as '{other}', but auto-complete-config "
        "function for model 'm' tries to set scheduling_choice as 'dynamic_batching'"
    )


def test_add_input_appends_new_tensors_as_given():
    cfg = make()
    tensor = {"name": "IN", "data_type": "TYPE_FP32", "dims": [3], "optional": True}
    cfg.add_input(tensor)
    assert cfg.as_dict()["input"] == [tensor]


def test_add_input_completes_an_untyped_input_of_the_same_name():
    cfg = make(input=[{"name": "IN", "data_type": "TYPE_INVALID", "dims": []}])
    cfg.add_input({"name": "IN", "data_type": "TYPE_INT8", "dims": [2, 2], "optional": True})
    assert cfg.as_dict()["input"] == [
        {"name": "IN", "data_type": "TYPE_INT8", "dims": [2, 2], "optional": True}
    ]


def test_add_input_conflicting_datatype():
    cfg = make(name="x", input=[{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}])
    with pytest.raises(ValueError) as info:
        cfg.add_input({"name": "X", "data_type": "TYPE_INT32", "dims": [1]})
    assert str(info.value) == (
        "unable to load model 'x', configuration expects datatype TYPE_FP32 for input 'X', "
        "model provides TYPE_INT32"
    )


def test_add_input_conflicting_dims_compares_python_values():
    cfg = make(input=[{"name": "X", "data_type": "TYPE_FP32", "dims": [3]}])
    # A tuple is not equal to the list read from JSON, as in Triton.
    with pytest.raises(ValueError) as info:
        cfg.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": (3,)})
    assert str(info.value) == (
        "model 'm', tensor 'X': the model expects dims (3,) but the model configuration "
        "specifies dims [3]"
    )


def test_add_input_conflicting_optional():
    cfg = make(input=[{"name": "X", "data_type": "TYPE_FP32", "dims": [3], "optional": False}])
    with pytest.raises(ValueError) as info:
        cfg.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [3], "optional": True})
    assert str(info.value) == (
        "model 'm', tensor 'X': the model expects optional True but the model configuration "
        "specifies optional False"
    )


def test_add_input_property_checks():
    cfg = make()
    with pytest.raises(ValueError) as info:
        cfg.add_input({"name": "a", "data_type": "TYPE_FP32", "dims": [1], "format": "x"})
    assert str(info.value) == (
        "input 'a' in auto-complete-config function for model 'm' contains property other "
        "than 'name', 'data_type', 'dims' and 'optional'."
    )
    with pytest.raises(ValueError) as info:
        cfg.add_input({"data_type": "TYPE_FP32", "dims": [1]})
    assert str(info.value) == (
        "input in auto-complete-config function for model 'm' is missing 'name' property."
    )
    with pytest.raises(ValueError) as info:
        cfg.add_input({"name": "a", "dims": [1]})
    assert str(info.value) == (
        "input 'a' in auto-complete-config function for model 'm' is missing 'data_type' property."
    )
    with pytest.raises(ValueError) as info:
        cfg.add_input({"name": "a", "data_type": "TYPE_FP32"})
    assert str(info.value) == (
        "input 'a' in auto-complete-config function for model 'm' is missing 'dims' property."
    )
    assert cfg.as_dict()["input"] == []


def test_add_output_rules():
    cfg = make(output=[{"name": "O", "data_type": "TYPE_FP32", "dims": [2]}])
    with pytest.raises(ValueError) as info:
        cfg.add_output({"name": "O", "data_type": "TYPE_FP32", "dims": [2], "optional": True})
    assert str(info.value) == (
        "output 'O' in auto-complete-config function for model 'm' contains property other "
        "than 'name', 'data_type' and 'dims'."
    )
    with pytest.raises(ValueError) as info:
        cfg.add_output({"name": "O", "data_type": "TYPE_INT64", "dims": [2]})
    assert str(info.value) == (
        "unable to load model 'm', configuration expects datatype TYPE_FP32 for output 'O', "
        "model provides TYPE_INT64"
    )
    cfg.add_output({"name": "O", "data_type": "TYPE_FP32", "dims": [2]})
    cfg.add_output({"name": "P", "data_type": "TYPE_BOOL", "dims": [1]})
    assert [o["name"] for o in cfg.as_dict()["output"]] == ["O", "P"]


def test_set_model_transaction_policy():
    cfg = make()
    cfg.set_model_transaction_policy({"decoupled": True})
    cfg.set_model_transaction_policy({"decoupled": True})
    assert cfg.as_dict()["model_transaction_policy"] == {"decoupled": True}
    with pytest.raises(ValueError) as info:
        cfg.set_model_transaction_policy({"decoupled": False})
    assert str(info.value) == (
        "trying to change decoupled property in auto-complete-config for model 'm', which is "
        "already set to 'True'."
    )
    with pytest.raises(ValueError) as info:
        cfg.set_model_transaction_policy({"stream": True})
    assert str(info.value) == (
        "model transaction property in auto-complete-config function for model 'm' contains "
        "property other than 'decoupled'."
    )
