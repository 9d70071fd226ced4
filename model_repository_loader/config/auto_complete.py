"""Calling `TritonPythonModel.auto_complete_config` and merging what it returns.

Triton hands the model the configuration as it stands at load time (instance groups already
normalized), takes back only `max_batch_size`, `input`, `output`, a scheduler when none was
configured, and `model_transaction_policy`, then normalizes again (so a dynamic batcher gets
`preferred_batch_size: [max_batch_size]`).
"""

from __future__ import annotations

import json
import logging

from tritonclient.grpc import model_config_pb2 as mc

from ..errors import format_python_error
from ..pb_utils.errors import ErrorCode
from ..pb_utils.model_config import ModelConfig
from .errors import ConfigError
from .json import ConfigJsonError, config_from_json, config_to_args_json
from .normalize import normalize_model_config

logger = logging.getLogger(__name__)


def _merge(current: mc.ModelConfig, updated: mc.ModelConfig) -> mc.ModelConfig:
    """Triton's UpdateModelConfig: take only what auto-complete may change."""
    merged = mc.ModelConfig()
    merged.CopyFrom(current)
    merged.max_batch_size = updated.max_batch_size
    del merged.input[:]
    merged.input.extend(updated.input)
    del merged.output[:]
    merged.output.extend(updated.output)

    current_choice = current.WhichOneof("scheduling_choice")
    updated_choice = updated.WhichOneof("scheduling_choice")
    if current_choice is None:
        if updated_choice is not None:
            getattr(merged, updated_choice).CopyFrom(getattr(updated, updated_choice))
    elif current_choice != updated_choice:
        # Triton prints the configured choice's field number twice here.
        number = mc.ModelConfig.DESCRIPTOR.fields_by_name[current_choice].number
        raise ConfigError(
            f"Cannot update scheduling choice from {number} to {number} when auto-completing.",
            code=ErrorCode.INTERNAL,
            stage="load",
        )

    if updated.HasField("model_transaction_policy"):
        merged.model_transaction_policy.decoupled = updated.model_transaction_policy.decoupled

    normalize_model_config(merged)
    return merged


def apply_auto_complete(
    config: mc.ModelConfig,
    model_class: type | None,
    model_name: str,
    *,
    config_provided: bool = True,
) -> mc.ModelConfig:
    """Run `model_class.auto_complete_config` (if it has one) and return the merged config.

    `config_provided` says whether a config.pbtxt existed: when the model returns something
    that does not parse as a ModelConfig, Triton silently keeps the configuration it had, which
    is an error only when there was no file.
    """
    hook = getattr(model_class, "auto_complete_config", None)
    if hook is None:
        return _merge(config, config)

    try:
        result = hook(ModelConfig(config_to_args_json(config)))
    except (Exception, SystemExit) as exc:  # sys.exit() in model code fails the load too
        raise ConfigError(format_python_error(exc), code=ErrorCode.INTERNAL, stage="load") from exc
    if not isinstance(result, ModelConfig):
        raise ConfigError(
            f"auto_complete_config function in model '{model_name}' must return a valid "
            "pb.ModelConfig object.",
            code=ErrorCode.INTERNAL,
            stage="load",
        )

    try:
        returned = json.dumps(result.as_dict())
    except (TypeError, ValueError) as exc:
        raise ConfigError(format_python_error(exc), code=ErrorCode.INTERNAL, stage="load") from exc
    try:
        updated = config_from_json(returned)
    except ConfigJsonError as exc:
        logger.warning(
            "auto_complete_config of model '%s' returned a configuration that is not a valid "
            "ModelConfig, ignoring it: %s",
            model_name,
            exc,
        )
        if not config_provided:
            raise ConfigError(
                f"model configuration is not provided for model '{model_name}'",
                code=ErrorCode.NOT_FOUND,
                stage="load",
            ) from None
        return _merge(config, config)
    return _merge(config, updated)
