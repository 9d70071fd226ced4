"""Configuration checks, with Triton's reason texts.

`validate_model_config` runs at repository poll and again at load; `validate_io_config` at load
(at poll too when auto-complete is off); `validate_instance_groups` at load.
"""

from __future__ import annotations

from collections.abc import Sequence

from tritonclient.grpc import model_config_pb2 as mc

from ..gpu.devices import MIN_COMPUTE_CAPABILITY
from ..pb_utils.errors import ErrorCode
from .errors import ConfigError, Stage
from .normalize import ENSEMBLE_PLATFORM

WILDCARD_DIM = -1
TENSORRT_PLATFORM = "tensorrt_plan"

_Group = mc.ModelInstanceGroup
_Control = mc.ModelSequenceBatching.Control

# Backends whose platform Triton knows, and the platforms that belong to them.
_BACKEND_PLATFORMS = {
    "tensorflow": {"tensorflow_graphdef", "tensorflow_savedmodel"},
    "tensorrt": {TENSORRT_PLATFORM},
    "onnxruntime": {"onnxruntime_onnx"},
    "pytorch": {"pytorch_libtorch"},
}
_CORRID_TYPES = {
    mc.TYPE_UINT64,
    mc.TYPE_INT64,
    mc.TYPE_UINT32,
    mc.TYPE_INT32,
    mc.TYPE_STRING,
}


def _fail(reason: str, stage: Stage, code: ErrorCode = ErrorCode.INVALID_ARG) -> ConfigError:
    return ConfigError(reason, code=code, stage=stage)


def validate_model_config(config: mc.ModelConfig, stage: Stage = "poll") -> None:
    """Everything but tensors and instance groups (Triton's ValidateModelConfig)."""
    name = config.name
    if not name:
        raise _fail("model configuration must specify 'name'", stage)

    if not config.backend:
        if config.platform != ENSEMBLE_PLATFORM:
            raise _fail(f"unexpected platform type '{config.platform}' for {name}", stage)
    elif config.platform == ENSEMBLE_PLATFORM:
        raise _fail(
            f"Ensemble model '{name}' must have platform type '{config.platform}' and empty "
            "backend type",
            stage,
        )

    platforms = _BACKEND_PLATFORMS.get(config.backend)
    if platforms is not None and config.platform not in platforms:
        raise _fail(
            f"unexpected 'platform' and 'backend' pair, got:{config.platform}, {config.backend}",
            stage,
        )

    if config.max_batch_size < 0:
        raise _fail(f"'max_batch_size' must be non-negative value for {name}", stage)

    if not config.HasField("version_policy"):
        raise _fail(f"must specify 'version policy' for {name}", stage)

    if config.HasField("dynamic_batching"):
        _validate_dynamic_batching(config, stage)

    if config.HasField("sequence_batching"):
        _validate_sequence_batching(config, stage)

    if config.HasField("ensemble_scheduling"):
        validate_ensemble_scheduling(config, stage)
    elif config.platform == ENSEMBLE_PLATFORM:
        raise _fail(
            f"ensemble scheduling must be set for ensemble {name} whose platform is "
            f"{ENSEMBLE_PLATFORM}",
            stage,
        )

    if config.model_transaction_policy.decoupled and config.response_cache.enable:
        raise _fail(
            f"Response Cache does not currently support model {name} with 'decoupled' "
            "transaction policy. Please disable the response cache.",
            stage,
        )

    if config.HasField("model_metrics"):
        for control in config.model_metrics.metric_control:
            if not control.HasField("metric_identifier"):
                raise _fail("metric control must specify 'metric_identifier'", stage)
            if not control.metric_identifier.family:
                raise _fail("metric identifier must specify non-empty 'family'", stage)
            if not control.HasField("histogram_options"):
                raise _fail("metric control must specify 'histogram_options'", stage)
            if not control.histogram_options.buckets:
                raise _fail("histogram options must specify non-empty 'buckets'", stage)


def _validate_dynamic_batching(config: mc.ModelConfig, stage: Stage) -> None:
    name = config.name
    batching = config.dynamic_batching
    for size in batching.preferred_batch_size:
        if size <= 0:
            raise _fail(f"dynamic batching preferred size must be positive for {name}", stage)
        if size > config.max_batch_size:
            raise _fail(
                f"dynamic batching preferred size must be <= max batch size for {name}", stage
            )

    levels = batching.priority_levels
    if levels != 0:
        if batching.default_priority_level == 0 or batching.default_priority_level > levels:
            raise _fail(f"default priority level must be in range [1, {levels}] for {name}", stage)
        for level in batching.priority_queue_policy:
            if level == 0 or level > levels:
                raise _fail(
                    f"priority queue policy must have priority level in range [1, {levels}] "
                    f"for {name}",
                    stage,
                )

    if batching.preserve_ordering:
        if levels > 1:
            raise _fail(
                f"Only one priority level is allowed when 'preserve_ordering' is true for {name}",
                stage,
            )
        policies = [batching.default_queue_policy, *batching.priority_queue_policy.values()]
        for policy in policies:
            if (
                policy.default_timeout_microseconds != 0
                and policy.timeout_action == mc.ModelQueuePolicy.DELAY
            ):
                raise _fail(
                    "Queue policy can not have DELAY as timeout action when 'preserve_ordering' "
                    f"is true for {name}",
                    stage,
                )


def _control_tensor(
    batcher: mc.ModelSequenceBatching, model: str, kind: int, typed: bool, stage: Stage
) -> tuple[str, int]:
    """(tensor name, data type) of the control of `kind`, ("", 0) if absent."""
    kind_name = _Control.Kind.Name(kind)
    seen_tensors: set[str] = set()
    found: tuple[str, int] | None = None
    for control_input in batcher.control_input:
        if not control_input.name:
            raise _fail(f"sequence batching control tensor must have a name for {model}", stage)
        if control_input.name in seen_tensors:
            raise _fail(
                f"sequence batching control tensor '{control_input.name}' is specified for "
                f"multiple control kinds for {model}",
                stage,
            )
        seen_tensors.add(control_input.name)
        for control in control_input.control:
            if control.kind != kind:
                continue
            if found is not None:
                raise _fail(
                    f"sequence batching specifies multiple {kind_name} tensors for {model}", stage
                )
            given = [
                bool(control.int32_false_true),
                bool(control.fp32_false_true),
                bool(control.bool_false_true),
            ]
            if typed:
                if any(given):
                    raise _fail(
                        "sequence batching must not specify either 'int32_false_true', "
                        f"'fp32_false_true' or 'bool_false_true' for {kind_name} for {model}",
                        stage,
                    )
                found = (control_input.name, control.data_type)
                continue
            if not any(given):
                raise _fail(
                    "sequence batching must specify either 'int32_false_true', "
                    f"'fp32_false_true' or 'bool_false_true' for {kind_name} for {model}",
                    stage,
                )
            if sum(given) > 1:
                raise _fail(
                    "sequence batching specifies more than one from 'int32_false_true', "
                    f"'fp32_false_true' and 'bool_false_true' for {kind_name} for {model}",
                    stage,
                )
            for field, values, dtype in (
                ("int32_false_true", control.int32_false_true, mc.TYPE_INT32),
                ("fp32_false_true", control.fp32_false_true, mc.TYPE_FP32),
                ("bool_false_true", control.bool_false_true, mc.TYPE_BOOL),
            ):
                if values and len(values) != 2:
                    raise _fail(
                        f"sequence batching control '{field}' must have exactly 2 entries for "
                        f"{kind_name} for {model}",
                        stage,
                    )
                if values:
                    found = (control_input.name, dtype)
    return found or ("", 0)


def _validate_sequence_batching(config: mc.ModelConfig, stage: Stage) -> None:
    name = config.name
    if config.response_cache.enable:
        raise _fail(
            f"Response Cache does not currently support model {name} with sequence batching "
            "scheduler. Please disable the response cache.",
            stage,
        )
    batcher = config.sequence_batching
    for kind in (
        _Control.CONTROL_SEQUENCE_START,
        _Control.CONTROL_SEQUENCE_END,
        _Control.CONTROL_SEQUENCE_READY,
    ):
        _control_tensor(batcher, name, kind, typed=False, stage=stage)
    tensor, dtype = _control_tensor(
        batcher, name, _Control.CONTROL_SEQUENCE_CORRID, typed=True, stage=stage
    )
    if tensor and dtype not in _CORRID_TYPES:
        raise _fail(
            f"unexpected data type for control CONTROL_SEQUENCE_CORRID for {name}. Allowed "
            "data types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING",
            stage,
        )
    if batcher.HasField("oldest"):
        for size in batcher.oldest.preferred_batch_size:
            if size <= 0:
                raise _fail(
                    f"sequence batching preferred batch size must be positive for {name}", stage
                )
            if size > config.max_batch_size:
                raise _fail(
                    f"sequence batching preferred batch size must be <= max batch size for {name}",
                    stage,
                )
    if batcher.HasField("direct"):
        utilization = batcher.direct.minimum_slot_utilization
        if utilization < 0.0 or utilization > 1.0:
            raise _fail(
                "sequence batching minimum slot utilization must be in range (0.0, 1.0] for "
                f"{name}",
                stage,
            )


def validate_ensemble_scheduling(config: mc.ModelConfig, stage: Stage = "poll") -> None:
    """The ensemble's own fields and its data flow (Triton's ValidateEnsembleSchedulingConfig)."""
    name = config.name
    if config.platform != ENSEMBLE_PLATFORM:
        raise _fail(
            f"ensemble scheduling cannot be set for model '{name}' whose platform is not "
            f"{ENSEMBLE_PLATFORM}",
            stage,
        )
    if config.instance_group:
        raise _fail(f"instance group should not be specified for ensemble '{name}'", stage)
    if config.HasField("optimization"):
        raise _fail(f"optimization should not be specified for ensemble '{name}'", stage)
    if config.model_warmup:
        raise _fail(f"model_warmup can not be specified for ensemble '{name}'", stage)
    steps = config.ensemble_scheduling.step
    if not steps:
        raise _fail(f"must specify 'step' for ensemble '{name}'", stage)

    # Graph of ensemble tensors: which tensors each produced tensor depends on.
    produced_by: dict[str, list[str]] = {}  # tensor -> the inputs of the step producing it
    consumers: dict[str, list[str]] = {}  # tensor -> tensors produced from it
    order: list[str] = []  # every tensor, in order of first mention
    for index, step in enumerate(steps):
        if not step.model_name:
            raise _fail(f"must specify 'model_name' in step {index} of ensemble '{name}'", stage)
        if not step.input_map:
            raise _fail(f"must specify 'input_map' in step {index} of ensemble '{name}'", stage)
        if not step.output_map:
            raise _fail(f"must specify 'output_map' in step {index} of ensemble '{name}'", stage)
        outputs = []
        for tensor in step.output_map.values():
            if tensor in produced_by:
                raise _fail(
                    f"ensemble tensor '{tensor}' can appear in an output map only once for "
                    f"ensemble '{name}' step {index}",
                    stage,
                )
            produced_by[tensor] = []
            consumers.setdefault(tensor, [])
            if tensor not in order:
                order.append(tensor)
            outputs.append(tensor)
        for tensor in step.input_map.values():
            consumers.setdefault(tensor, [])
            if tensor not in order:
                order.append(tensor)
            for output in outputs:
                produced_by[output].append(tensor)
                consumers[tensor].append(output)

    ready: set[str] = set()
    queue = []
    for io in config.input:
        if io.name not in consumers:
            raise _fail(f"ensemble input '{io.name}' for ensemble {name}' is not used", stage)
        ready.add(io.name)
        queue.append(io.name)
    while queue:
        tensor = queue.pop(0)
        for nxt in consumers[tensor]:
            if nxt not in ready and all(dep in ready for dep in produced_by.get(nxt, [])):
                ready.add(nxt)
                queue.append(nxt)

    outputs_ok = set()
    for io in config.output:
        if io.name not in consumers:
            raise _fail(f"ensemble output '{io.name}' for ensemble {name}' is not used", stage)
        if io.name not in ready:
            message = f"output '{io.name}' for ensemble '{name}' is not written"
            source = _unconnected_source(io.name, produced_by, ready)
            if source != io.name:
                message += f": at least one of its depending tensors, '{source}', is not connected"
            raise _fail(message, stage)
        outputs_ok.add(io.name)

    for tensor in sorted(order):
        if tensor in outputs_ok:
            continue
        if tensor not in ready or not consumers[tensor]:
            raise _fail(f"ensemble tensor '{tensor}' is unused in ensemble '{name}'", stage)


def _unconnected_source(tensor: str, produced_by: dict[str, list[str]], ready: set[str]) -> str:
    """Follow not-ready dependencies back to the first tensor nothing writes."""
    last = tensor
    seen: set[str] = set()
    deps = produced_by.get(tensor, [])
    while deps:
        nxt = next((d for d in deps if d not in ready and d not in seen), None)
        if nxt is None:
            break
        seen.add(nxt)
        last = nxt
        deps = produced_by.get(nxt, [])
    return last


def validate_io_config(config: mc.ModelConfig, stage: Stage = "load") -> None:
    """Inputs, outputs and batch inputs/outputs (Triton's ValidateModelIOConfig)."""
    suffix = f" for {config.name}"
    try:
        for io in config.input:
            _validate_tensor(io, config.max_batch_size, "model input ")
            if (
                io.format in (mc.ModelInput.FORMAT_NHWC, mc.ModelInput.FORMAT_NCHW)
                and len(io.dims) != 3
            ):
                raise ValueError("model input NHWC/NCHW require 3 dims")
            _validate_tensor_kind(io, config.platform, "input")
        for io in config.output:
            _validate_tensor(io, config.max_batch_size, "model output ")
            _validate_tensor_kind(io, config.platform, "output")
        _validate_batch_io(config)
    except ValueError as exc:
        raise _fail(f"{exc}{suffix}", stage) from None


def _element_count(dims: Sequence[int]) -> int:
    # Triton's GetElementCount: -1 if any dimension is variable, 0 for no dimensions.
    count = 0
    for dim in dims:
        if dim == WILDCARD_DIM:
            return -1
        count = dim if count == 0 else count * dim
    return count


def _validate_tensor(io: mc.ModelInput | mc.ModelOutput, max_batch_size: int, prefix: str) -> None:
    if not io.name:
        raise ValueError(f"{prefix}must specify 'name'")
    prefix = f"{prefix}'{io.name}' "
    if io.data_type == mc.TYPE_INVALID:
        raise ValueError(f"{prefix}must specify 'data_type'")
    if not io.dims:
        raise ValueError(f"{prefix}must specify 'dims'")
    has_reshape = io.HasField("reshape")
    if has_reshape and not io.reshape.shape and max_batch_size == 0:
        raise ValueError(
            f"{prefix}cannot have empty reshape for non-batching model as scalar tensors are "
            "not supported"
        )
    for dim in io.dims:
        if dim < 1 and dim != WILDCARD_DIM:
            raise ValueError(
                f"{prefix}dimension must be integer >= 1, or {WILDCARD_DIM} to indicate a "
                "variable-size dimension"
            )
    if not has_reshape:
        return
    for dim in io.reshape.shape:
        if dim < 1 and dim != WILDCARD_DIM:
            raise ValueError(
                f"{prefix}reshape dimensions must be integer >= 1, or {WILDCARD_DIM} to "
                "indicate a variable-size dimension"
            )
    dims_size = _element_count(io.dims)
    reshape_size = _element_count(io.reshape.shape)
    # An empty reshape means a scalar: the dims must hold exactly one element.
    if dims_size != reshape_size and (reshape_size != 0 or dims_size != 1):
        raise ValueError(f"{prefix}has different size for dims and reshape")
    if dims_size == -1:
        # With variable dimensions, the fixed runs between them must match one to one.
        if _fixed_runs(io.dims) != _fixed_runs(io.reshape.shape):
            if len(_fixed_runs(io.dims)) != len(_fixed_runs(io.reshape.shape)):
                raise ValueError(
                    f"{prefix}has different number of variable-size dimensions for dims and reshape"
                )
            raise ValueError(f"{prefix}has different size for dims and reshape")


def _fixed_runs(dims: Sequence[int]) -> list[int]:
    runs, current = [], 1
    for dim in dims:
        if dim == WILDCARD_DIM:
            runs.append(current)
            current = 1
        else:
            current *= dim
    runs.append(current)
    return runs


def _validate_tensor_kind(io: mc.ModelInput | mc.ModelOutput, platform: str, kind: str) -> None:
    if platform != TENSORRT_PLATFORM and io.is_shape_tensor:
        raise ValueError("shape tensors are only supported for TensorRT platform")
    if io.is_non_linear_format_io:
        if platform != TENSORRT_PLATFORM:
            raise ValueError("Non-linear IO format is only supported for the TensorRT platform")
        if len(io.dims) != 3:
            raise ValueError(f"Non-linear IO format {kind} requires 3 dims")


def _validate_batch_io(config: mc.ModelConfig) -> None:
    inputs = {io.name for io in config.input}
    outputs = {io.name for io in config.output}
    for batch_input in config.batch_input:
        kind = mc.BatchInput.Kind.Name(batch_input.kind)
        if len(batch_input.source_input) != 1:
            raise ValueError(
                f"batch input kind '{kind}' expects 1 source input, got "
                f"{len(batch_input.source_input)}"
            )
        if batch_input.data_type not in (mc.TYPE_INT32, mc.TYPE_FP32):
            raise ValueError("batch input data type must be TYPE_INT32 or TYPE_FP32")
        for source in batch_input.source_input:
            if source not in inputs:
                raise ValueError(f"unknown source input name '{source}'")
    for batch_output in config.batch_output:
        kind = mc.BatchOutput.Kind.Name(batch_output.kind)
        if len(batch_output.source_input) != 1:
            raise ValueError(
                f"batch output kind '{kind}' expects 1 source input, got "
                f"{len(batch_output.source_input)}"
            )
        for source in batch_output.source_input:
            if source not in inputs:
                raise ValueError(f"unknown source input name '{source}'")
        targets: set[str] = set()
        for target in batch_output.target_name:
            if target not in outputs:
                raise ValueError(f"unknown target output name '{target}'")
            if target in targets:
                raise ValueError(f"target output name '{target}' can only be specified once")
            targets.add(target)


def validate_instance_groups(
    config: mc.ModelConfig,
    gpu_ids: Sequence[int] = (),
    min_compute_capability: float = MIN_COMPUTE_CAPABILITY,
    stage: Stage = "load",
) -> None:
    """Kinds, GPUs and profiles of the (normalized) instance groups."""
    if config.HasField("ensemble_scheduling"):
        return
    name = config.name
    if not config.instance_group:
        raise _fail(f"must specify one or more 'instance group's for {name}", stage)
    supported = sorted(set(gpu_ids))
    for group in config.instance_group:
        where = f"instance group {group.name} of model {name}"
        if group.kind == _Group.KIND_MODEL:
            if group.gpus:
                raise _fail(f"{where} has kind KIND_MODEL but specifies one or more GPUs", stage)
        elif group.kind == _Group.KIND_GPU:
            if not group.gpus:
                if not supported:
                    raise _fail(f"{where} has kind KIND_GPU but no GPUs are available", stage)
                raise _fail(f"{where} has kind KIND_GPU but specifies no GPUs", stage)
            for gpu in group.gpus:
                if gpu not in supported:
                    raise _fail(
                        f"{where} specifies invalid or unsupported gpu id {gpu}. GPUs with at "
                        "least the minimum required CUDA compute compatibility of "
                        f"{min_compute_capability:f} are: {', '.join(map(str, supported))}",
                        stage,
                    )
        elif group.kind == _Group.KIND_CPU:
            if group.gpus:
                raise _fail(f"{where} has kind KIND_CPU but specifies one or more GPUs", stage)
        else:
            raise _fail(f"{where} has unexpected kind KIND_AUTO", stage, code=ErrorCode.INTERNAL)

        if config.platform != TENSORRT_PLATFORM and group.profile:
            raise _fail(
                f"{where} and platform {config.platform}specifies profile field which is only "
                "supported for TensorRT models",
                stage,
            )


# python_backend's stub launcher refuses a stub whose name holds one of these (src/pb_utils.h
# INVALID_CHARS, since 25.09): the auto-complete stub is named after the model, an instance's
# stub after the instance (`<group name>_<k>`). No code of the model runs first.
_STUB_NAME_INVALID_CHARS = frozenset(";|&$`<>()[]{}\\\"'*?~#!")
INVALID_STUB_NAME = "Invalid stub name: contains invalid characters"


def validate_stub_name(name: str) -> None:
    """Refuse `name` for a Python backend stub as python_backend's `IsValidIdentifier` does."""
    if not name or not _STUB_NAME_INVALID_CHARS.isdisjoint(name):
        raise _fail(INVALID_STUB_NAME, "load")
