"""The defaults Triton fills into a model configuration, in Triton's three steps.

1. `autofill_backend_fields`: name from the directory, `backend`/`platform`/
   `default_model_filename` from the files in the first version directory (repository poll).
2. `normalize_model_config`: version policy, preferred batch sizes, sequence idle time, pinned
   memory (repository poll, and again after auto-complete).
3. `normalize_instance_groups`: group names, kinds, counts and GPUs (per version, at load).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from .errors import ConfigError

PYTHON_BACKEND = "python"
PYTHON_FILENAME = "model.py"
ENSEMBLE_PLATFORM = "ensemble"
SEQUENCE_IDLE_DEFAULT_MICROSECONDS = 1_000_000

_Group = mc.ModelInstanceGroup

# Known model files of Triton's other backends. Python models are what this package runs, but
# recognising the others keeps `backend` what Triton would report for them.
_TF_SAVEDMODEL = ("model.savedmodel", "tensorflow_savedmodel")
_TF_GRAPHDEF = ("model.graphdef", "tensorflow_graphdef")
_TENSORRT = ("model.plan", "tensorrt_plan", "tensorrt")
_ONNX = ("model.onnx", "onnxruntime_onnx", "onnxruntime")
_OPENVINO = ("model.xml", "openvino")
_PYTORCH = ("model.pt", "pytorch_libtorch", "pytorch")

# The python backend (GPU build, as Triton ships it) prefers GPU instances when GPUs exist.
PYTHON_PREFERRED_GROUPS = (_Group(kind=_Group.KIND_GPU, count=0),)


def _first_version_dir(model_path: Path) -> Path | None:
    # Triton inspects the first subdirectory in byte order, whatever its name.
    subdirs = sorted((p for p in model_path.iterdir() if p.is_dir()), key=lambda p: p.name.encode())
    return subdirs[0] if subdirs else None


def autofill_backend_fields(config: mc.ModelConfig, model_name: str, model_path: Path) -> None:
    """Fill `name`, and `backend`/`platform`/`default_model_filename` when they can be inferred."""
    version_dir = _first_version_dir(model_path)
    contents = {p.name: p for p in version_dir.iterdir()} if version_dir else {}

    def has_file(name: str) -> bool:
        return name in contents and not contents[name].is_dir()

    def has_dir(name: str) -> bool:
        return name in contents and contents[name].is_dir()

    if not config.name:
        config.name = model_name

    filename = config.default_model_filename

    # TensorFlow: only the platform tells, from the file name given or found.
    if not config.platform and config.backend in ("", "tensorflow"):
        if filename == _TF_SAVEDMODEL[0]:
            config.platform = _TF_SAVEDMODEL[1]
        elif filename == _TF_GRAPHDEF[0]:
            config.platform = _TF_GRAPHDEF[1]
        elif not filename and version_dir is not None:
            if has_dir(_TF_SAVEDMODEL[0]):
                config.platform = _TF_SAVEDMODEL[1]
            if has_file(_TF_GRAPHDEF[0]):
                config.platform = _TF_GRAPHDEF[1]
    if config.platform in (_TF_SAVEDMODEL[1], _TF_GRAPHDEF[1]):
        config.backend = config.backend or "tensorflow"
        if not config.default_model_filename:
            tf = _TF_SAVEDMODEL if config.platform == _TF_SAVEDMODEL[1] else _TF_GRAPHDEF
            config.default_model_filename = tf[0]
        return

    guessing = not config.platform and not filename and version_dir is not None

    # TensorRT
    if not config.backend:
        if config.platform == _TENSORRT[1] or filename == _TENSORRT[0]:
            config.backend = _TENSORRT[2]
        elif guessing and has_file(_TENSORRT[0]):
            config.backend = _TENSORRT[2]
    if config.backend == _TENSORRT[2]:
        config.platform = config.platform or _TENSORRT[1]
        config.default_model_filename = config.default_model_filename or _TENSORRT[0]
        return

    # ONNX Runtime (the model may be a file or a directory)
    if not config.backend:
        if config.platform == _ONNX[1] or filename == _ONNX[0]:
            config.backend = _ONNX[2]
        elif guessing and _ONNX[0] in contents:
            config.backend = _ONNX[2]
    if config.backend == _ONNX[2]:
        config.platform = config.platform or _ONNX[1]
        config.default_model_filename = config.default_model_filename or _ONNX[0]
        return

    # OpenVINO
    if not config.backend:
        if filename == _OPENVINO[0] or (guessing and _OPENVINO[0] in contents):
            config.backend = _OPENVINO[1]
    if config.backend == _OPENVINO[1]:
        config.default_model_filename = config.default_model_filename or _OPENVINO[0]
        return

    # PyTorch
    if not config.backend:
        if config.platform == _PYTORCH[1] or filename == _PYTORCH[0]:
            config.backend = _PYTORCH[2]
        elif guessing and has_file(_PYTORCH[0]):
            config.backend = _PYTORCH[2]
            config.platform = _PYTORCH[1]
    if config.backend == _PYTORCH[2]:
        if not config.platform:
            config.platform = _PYTORCH[1]
            config.default_model_filename = config.default_model_filename or _PYTORCH[0]
        return

    # Python
    if not config.backend:
        if filename == PYTHON_FILENAME or (guessing and PYTHON_FILENAME in contents):
            config.backend = PYTHON_BACKEND
    if config.backend == PYTHON_BACKEND:
        config.default_model_filename = config.default_model_filename or PYTHON_FILENAME
        return

    # Custom backend: nothing said and nothing recognised; "model.<backend>" names it.
    if not config.backend and not config.platform and not config.default_model_filename:
        if "." not in model_name:
            raise ConfigError(
                f"Invalid model name: Could not determine backend for model '{model_name}' "
                "with no backend in model configuration. Expected model name of the form "
                "'model.<backend_name>'.",
                stage="poll",
            )
        backend = model_name.split(".", 1)[1]
        config.backend = backend
        config.default_model_filename = f"model.{backend}"


def normalize_model_config(config: mc.ModelConfig) -> None:
    """Defaults that need no knowledge of the backend (Triton's NormalizeModelConfig)."""
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1

    if config.HasField("dynamic_batching"):
        batching = config.dynamic_batching
        if not batching.preferred_batch_size and config.max_batch_size > 0:
            batching.preferred_batch_size.append(config.max_batch_size)

    if config.HasField("sequence_batching"):
        sequence = config.sequence_batching
        if sequence.max_sequence_idle_microseconds == 0:
            sequence.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_MICROSECONDS
        if sequence.HasField("oldest"):
            oldest = sequence.oldest
            if not oldest.preferred_batch_size and config.max_batch_size > 0:
                oldest.preferred_batch_size.append(config.max_batch_size)

    if not config.HasField("ensemble_scheduling"):
        optimization = config.optimization
        if not optimization.HasField("input_pinned_memory"):
            optimization.input_pinned_memory.enable = True
        if not optimization.HasField("output_pinned_memory"):
            optimization.output_pinned_memory.enable = True


def normalize_instance_groups(
    config: mc.ModelConfig,
    gpu_ids: Sequence[int] = (),
    preferred_groups: Sequence[mc.ModelInstanceGroup] = PYTHON_PREFERRED_GROUPS,
) -> None:
    """Name, kind, count and GPUs of every instance group (Triton's NormalizeInstanceGroup).

    `gpu_ids` are the GPUs this host can use; empty means a CPU-only host.
    """
    if config.HasField("ensemble_scheduling"):
        return
    supported = sorted(set(gpu_ids))

    if not config.instance_group:
        # The group the server makes gets the model's own name (explicit groups get "_<i>").
        group = config.instance_group.add(name=config.name)
        for preferred in preferred_groups:
            if preferred.kind == _Group.KIND_GPU:
                if not supported:
                    continue
                group.gpus.extend(g for g in preferred.gpus if g in supported)
            elif preferred.kind == _Group.KIND_AUTO:
                group.gpus.extend(preferred.gpus)
            group.kind = preferred.kind
            group.count = preferred.count
            break

    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"

        if group.kind == _Group.KIND_AUTO:
            if not supported or any(g not in supported for g in group.gpus):
                group.kind = _Group.KIND_CPU
            else:
                group.kind = _Group.KIND_GPU

        for preferred in preferred_groups:
            if group.kind != preferred.kind:
                continue
            if group.kind == _Group.KIND_GPU and not group.gpus and preferred.gpus:
                group.gpus.extend(g for g in preferred.gpus if g in supported)
                if not group.gpus:
                    continue
            if group.count < 1 and preferred.count > 0:
                group.count = preferred.count

        if group.count < 1:
            # Triton gives 2 CPU instances to TensorFlow and ONNX Runtime models, 1 otherwise.
            cpu_pair = group.kind == _Group.KIND_CPU and config.backend in (
                "tensorflow",
                "onnxruntime",
            )
            group.count = 2 if cpu_pair else 1

        if group.kind == _Group.KIND_GPU and not group.gpus:
            group.gpus.extend(supported)
