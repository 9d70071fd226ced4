"""A model's configuration from its directory, in the order Triton builds it.

Repository poll (`read_model_config`): read config.pbtxt (optional with auto-complete), fill
name/backend, normalize, validate, check the name against the directory.
Version selection (`repository.select_versions`).
Load of one version (`finalize_config`): instance groups, `auto_complete_config`, validation
of the result (tensors included).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

# Module import (not names): repository imports config.errors, so names may not exist yet here.
from .. import repository
from ..errors import format_python_error
from ..gpu.devices import MIN_COMPUTE_CAPABILITY
from ..isolation.environments import EnvironmentLimits
from ..pb_utils.errors import ErrorCode
from .auto_complete import apply_auto_complete
from .errors import ConfigError
from .normalize import (
    ENSEMBLE_PLATFORM,
    PYTHON_BACKEND,
    autofill_backend_fields,
    normalize_instance_groups,
    normalize_model_config,
)
from .parse import read_config_file
from .validate import (
    validate_instance_groups,
    validate_io_config,
    validate_model_config,
    validate_stub_name,
)

logger = logging.getLogger(__name__)

# Imports a model file and returns its TritonPythonModel class; exceptions become load errors.
ModelClassLoader = Callable[[Path], type | None]  # None: model.py defines no TritonPythonModel


@dataclass(frozen=True)
class ConfigOptions:
    """Server options that change how configurations are built.

    auto_complete: Triton's default; off = `--disable-auto-complete-config` (or the deprecated
        `--strict-model-config=true`): config.pbtxt is then required, tensors are validated at
        repository poll, and `auto_complete_config` is not called.
    model_config_name: `--model-config-name`; reads `<model>/configs/<name>.pbtxt` if present.
    gpu_ids: GPUs this host offers (`gpu/devices.py`, CUDA ordinals whose compute capability
        is at least `min_compute_capability`). Empty (a CPU-only host): default instance groups
        are KIND_CPU and a KIND_GPU group fails to load, as in Triton.
    min_compute_capability: `--min-supported-compute-capability`, named in the load error of
        a group that asks for an unsupported GPU.
    gpu_fallback_to_cpu: not in Triton; with no GPUs, run KIND_GPU groups as KIND_CPU (with a
        warning) so repositories written for GPU hosts load on CPU-only ones.
    instance_kind: not in Triton; `--instance-kind`: "auto", "thread" or "process", the default
        for models whose config does not set BRIDGE_INSTANCE_KIND (isolation/kind.py).
    environment_limits: not in Triton; how large an `EXECUTION_ENV_PATH` archive may unpack and
        the environment cache grow (isolation/environments.py).
    """

    auto_complete: bool = True
    model_config_name: str = ""
    gpu_ids: tuple[int, ...] = ()
    min_compute_capability: float = MIN_COMPUTE_CAPABILITY
    gpu_fallback_to_cpu: bool = False
    instance_kind: str = "auto"
    environment_limits: EnvironmentLimits = EnvironmentLimits()


def config_file_exists(source: repository.ModelSource, options: ConfigOptions) -> bool:
    return repository.config_path(source, options.model_config_name).exists()


def read_model_config(
    source: repository.ModelSource, options: ConfigOptions = ConfigOptions()
) -> mc.ModelConfig:
    """The configuration as Triton has it after polling the repository (stage "poll")."""
    if source.error is not None:
        raise source.error
    path = repository.config_path(source, options.model_config_name)
    if options.auto_complete and not path.exists():
        config = mc.ModelConfig()
    else:
        config = read_config_file(path)

    return polled_config(config, source, options)


def polled_config(
    config: mc.ModelConfig, source: repository.ModelSource, options: ConfigOptions
) -> mc.ModelConfig:
    """What Triton does to a config read at repository poll (also a load-time override):
    fill in the backend fields, normalize, and check it. Changes `config` in place."""
    autofill_backend_fields(config, source.name, source.path)
    normalize_model_config(config)
    validate_model_config(config, stage="poll")
    if not options.auto_complete:
        validate_io_config(config, stage="poll")
    if config.name != source.name:
        raise ConfigError(
            f"unexpected directory name '{source.name}' for model '{config.name}', directory "
            "name must equal model name",
            stage="poll",
        )
    return config


def _fall_back_to_cpu(config: mc.ModelConfig) -> None:
    kind_gpu = mc.ModelInstanceGroup.KIND_GPU
    for group in config.instance_group:
        if group.kind == kind_gpu:
            logger.warning(
                "model '%s': no GPU available, running KIND_GPU instance group %s on CPU",
                config.name,
                group.name or "(unnamed)",
            )
            group.kind = mc.ModelInstanceGroup.KIND_CPU
            del group.gpus[:]


def finalize_config(
    config: mc.ModelConfig,
    source: repository.ModelSource,
    version: int,
    options: ConfigOptions = ConfigOptions(),
    model_class_loader: ModelClassLoader | None = None,
    *,
    config_provided: bool = True,
) -> mc.ModelConfig:
    """The final configuration of one version (stage "load"); `config` is left unchanged.

    For python models the model file must exist, and with auto-complete on and a
    `model_class_loader`, the class's `auto_complete_config` is applied.
    """
    final = mc.ModelConfig()
    final.CopyFrom(config)
    if options.gpu_fallback_to_cpu and not options.gpu_ids:
        _fall_back_to_cpu(final)
    normalize_instance_groups(final, options.gpu_ids)
    validate_instance_groups(final, options.gpu_ids, options.min_compute_capability)

    if final.backend == PYTHON_BACKEND:
        path = repository.model_file(source, version, final)
        if options.auto_complete:
            validate_stub_name(final.name)  # the auto-complete stub's name, before it starts
        if options.auto_complete and model_class_loader is not None:
            try:
                model_class = model_class_loader(path)
            except ConfigError:
                raise
            except (Exception, SystemExit) as exc:
                raise ConfigError(
                    format_python_error(exc), code=ErrorCode.INTERNAL, stage="load"
                ) from exc
            final = apply_auto_complete(
                final, model_class, source.name, config_provided=config_provided
            )

    if final.platform == ENSEMBLE_PLATFORM:
        # Triton always sets an ensemble's transaction policy, to "decoupled" exactly when a
        # composing model on the data path is decoupled; whoever builds the ensemble knows the
        # composing models and must set `decoupled` accordingly.
        final.model_transaction_policy.SetInParent()

    validate_model_config(final, stage="load")
    validate_io_config(final, stage="load")
    if final.backend == PYTHON_BACKEND:
        # Each instance's stub is named `<group name>_<k>`: only the group name can be refused.
        for group in final.instance_group:
            validate_stub_name(group.name)
    return final


def load_config(
    source: repository.ModelSource,
    options: ConfigOptions = ConfigOptions(),
    model_class_loader: ModelClassLoader | None = None,
    version: int | None = None,
) -> mc.ModelConfig:
    """The final configuration of `version` (default: the highest version the policy selects).

    Raises ConfigError; its `stage` tells which of Triton's steps failed.
    """
    config = read_model_config(source, options)
    versions = repository.select_versions(source, config)
    if version is None:
        version = versions[-1]
    elif version not in versions:
        raise ValueError(f"version {version} of model '{source.name}' is not selected to load")
    return finalize_config(
        config,
        source,
        version,
        options,
        model_class_loader,
        config_provided=config_file_exists(source, options),
    )
