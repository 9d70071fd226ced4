"""`pb_utils.ModelConfig`: the object `auto_complete_config` receives and returns.

It wraps the JSON form of the model configuration as a plain dict. Models may read or edit
the dict directly (`as_dict()` is the live dict); the setters below check what they change
against what the configuration already says and raise `ValueError` with Triton's texts.
"""

from __future__ import annotations

import json
from typing import Any

_INPUT_PROPERTIES = ("name", "data_type", "dims", "optional")
_OUTPUT_PROPERTIES = ("name", "data_type", "dims")
_TRANSACTION_POLICY_PROPERTIES = ("decoupled",)


class ModelConfig:
    """The model configuration handed to `TritonPythonModel.auto_complete_config`."""

    def __init__(self, model_config: str) -> None:
        self._model_config: dict[str, Any] = json.loads(model_config)

    def as_dict(self) -> dict[str, Any]:
        """The live configuration dict (edits are kept)."""
        return self._model_config

    @property
    def _name(self) -> str:
        return self._model_config["name"]

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Set max_batch_size; lowering a value the configuration already gives is an error."""
        configured = self._model_config["max_batch_size"]
        if configured > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {configured}, but in "
                f"auto-complete-config function for model '{self._name}' specified "
                f"max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Use the dynamic batcher unless another scheduler is configured."""
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but "
                    f"auto-complete-config function for model '{self._name}' tries to set "
                    "scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:
        """Add an input, or complete the one of that name the configuration already has."""
        self._add_tensor("input", input, _INPUT_PROPERTIES)

    def add_output(self, output: dict[str, Any]) -> None:
        """Add an output, or complete the one of that name the configuration already has."""
        self._add_tensor("output", output, _OUTPUT_PROPERTIES)

    def _add_tensor(self, kind: str, tensor: dict[str, Any], allowed: tuple[str, ...]) -> None:
        model = self._name
        for key in tensor:
            if key not in allowed:
                # Triton reads the name here before checking it is present: a tensor with an
                # unknown key and no name raises KeyError('name'), as it does there.
                listed = ", ".join(f"'{p}'" for p in allowed[:-1]) + f" and '{allowed[-1]}'"
                raise ValueError(
                    f"{kind} '{tensor['name']}' in auto-complete-config function for model "
                    f"'{model}' contains property other than {listed}."
                )
        if "name" not in tensor:
            raise ValueError(
                f"{kind} in auto-complete-config function for model '{model}' is missing "
                "'name' property."
            )
        for required in ("data_type", "dims"):
            if required not in tensor:
                raise ValueError(
                    f"{kind} '{tensor['name']}' in auto-complete-config function for model "
                    f"'{model}' is missing '{required}' property."
                )

        name = tensor["name"]
        for current in self._model_config[kind]:
            if current["name"] != name:
                continue
            if (
                current["data_type"] != "TYPE_INVALID"
                and current["data_type"] != tensor["data_type"]
            ):
                raise ValueError(
                    f"unable to load model '{model}', configuration expects datatype "
                    f"{current['data_type']} for {kind} '{name}', model provides "
                    f"{tensor['data_type']}"
                )
            # Empty dims in the configuration mean "not given yet"; any other difference is a
            # conflict (plain != on the Python values, so a tuple never equals a list).
            if current["dims"] and current["dims"] != tensor["dims"]:
                raise ValueError(
                    f"model '{model}', tensor '{name}': the model expects dims "
                    f"{tensor['dims']} but the model configuration specifies dims "
                    f"{current['dims']}"
                )
            if (
                kind == "input"
                and "optional" in current
                and "optional" in tensor
                and current["optional"] != tensor["optional"]
            ):
                raise ValueError(
                    f"model '{model}', tensor '{name}': the model expects optional "
                    f"{tensor['optional']} but the model configuration specifies optional "
                    f"{current['optional']}"
                )
            current["data_type"] = tensor["data_type"]
            current["dims"] = tensor["dims"]
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        self._model_config[kind].append(tensor)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        """Set `model_transaction_policy` (only `decoupled` may be given)."""
        for key in transaction_policy_dict:
            if key not in _TRANSACTION_POLICY_PROPERTIES:
                raise ValueError(
                    "model transaction property in auto-complete-config function for model "
                    f"'{self._name}' contains property other than 'decoupled'."
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config for model "
                    f"'{self._name}', which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted
