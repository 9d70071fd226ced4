"""Model configurations: config.pbtxt → normalized, validated, auto-completed `ModelConfig`.

Pure functions over `tritonclient.grpc.model_config_pb2.ModelConfig`; nothing here imports a
model (the caller passes a class loader).
"""

from .auto_complete import apply_auto_complete
from .errors import ConfigError
from .json import config_from_json, config_to_args_json, config_to_dict
from .load import (
    ConfigOptions,
    ModelClassLoader,
    config_file_exists,
    finalize_config,
    load_config,
    polled_config,
    read_model_config,
)
from .normalize import (
    PYTHON_BACKEND,
    autofill_backend_fields,
    normalize_instance_groups,
    normalize_model_config,
)
from .parse import parse_config_text, read_config_file
from .validate import validate_instance_groups, validate_io_config, validate_model_config

__all__ = [
    "PYTHON_BACKEND",
    "ConfigError",
    "ConfigOptions",
    "ModelClassLoader",
    "apply_auto_complete",
    "autofill_backend_fields",
    "config_file_exists",
    "config_from_json",
    "config_to_args_json",
    "config_to_dict",
    "finalize_config",
    "load_config",
    "normalize_instance_groups",
    "normalize_model_config",
    "parse_config_text",
    "read_config_file",
    "polled_config",
    "read_model_config",
    "validate_instance_groups",
    "validate_io_config",
    "validate_model_config",
]
