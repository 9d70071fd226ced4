"""Config pipeline details the oracle cannot show on this CPU-only machine, or that need no server.

Expected values are Triton's (spec §3.3, and Triton core's model_config_utils: instance group
normalization with GPUs, the 64-bit JSON fixes, enum parsing); the CPU-side behaviour of the
same functions is replayed against real Triton in test_config_oracle.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from model_repository_loader import repository
from model_repository_loader.config import (
    ConfigError,
    ConfigOptions,
    apply_auto_complete,
    autofill_backend_fields,
    config_from_json,
    config_to_args_json,
    config_to_dict,
    load_config,
    normalize_instance_groups,
    validate_instance_groups,
    validate_io_config,
    validate_model_config,
)
from model_repository_loader.errors import format_python_error
from model_repository_loader.pb_utils import ModelConfig

KIND = mc.ModelInstanceGroup


def parse(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def python_model(root: Path, name: str, config: str | None, source: str = "") -> Path:
    path = root / name
    (path / "1").mkdir(parents=True)
    (path / "1" / "model.py").write_text(source or "class TritonPythonModel:\n    pass\n")
    if config is not None:
        (path / "config.pbtxt").write_text(config)
    return path


# -- instance groups with GPUs ------------------------------------------------------------------


def test_default_group_on_a_gpu_host_uses_every_gpu():
    config = parse('name: "m" backend: "python"')
    normalize_instance_groups(config, gpu_ids=(1, 0))
    (group,) = config.instance_group
    assert (group.name, group.kind, group.count, list(group.gpus)) == (
        "m",
        KIND.KIND_GPU,
        1,
        [0, 1],
    )
    validate_instance_groups(config, gpu_ids=(0, 1))


def test_explicit_groups_on_a_gpu_host():
    config = parse(
        'name: "m" instance_group [{count: 2 kind: KIND_GPU}, {kind: KIND_AUTO gpus: [3]}, '
        "{kind: KIND_AUTO gpus: [1]}]"
    )
    normalize_instance_groups(config, gpu_ids=(0, 1))
    kinds = [(g.name, g.kind, g.count, list(g.gpus)) for g in config.instance_group]
    assert kinds == [
        ("m_0", KIND.KIND_GPU, 2, [0, 1]),
        ("m_1", KIND.KIND_CPU, 1, [3]),  # an unknown GPU makes AUTO fall back to CPU
        ("m_2", KIND.KIND_GPU, 1, [1]),
    ]


def test_unsupported_gpu_id_text():
    config = parse('name: "m" instance_group [{name: "g" kind: KIND_GPU gpus: [4]}]')
    normalize_instance_groups(config, gpu_ids=(0, 1))
    with pytest.raises(ConfigError) as info:
        validate_instance_groups(config, gpu_ids=(0, 1))
    assert str(info.value) == (
        "instance group g of model m specifies invalid or unsupported gpu id 4. GPUs with at "
        "least the minimum required CUDA compute compatibility of 6.000000 are: 0, 1"
    )


def test_tensorflow_and_onnx_get_two_cpu_instances():
    for backend, count in (("onnxruntime", 2), ("tensorflow", 2), ("python", 1)):
        config = parse(f'name: "m" backend: "{backend}" instance_group [{{kind: KIND_CPU}}]')
        normalize_instance_groups(config)
        assert config.instance_group[0].count == count


def test_gpu_fallback_option(tmp_path):
    python_model(tmp_path, "m", 'backend: "python" instance_group [{kind: KIND_GPU gpus: [0]}]')
    source = repository.scan([tmp_path])[0]
    with pytest.raises(ConfigError, match="invalid or unsupported gpu id 0"):
        load_config(source)
    config = load_config(source, ConfigOptions(gpu_fallback_to_cpu=True))
    (group,) = config.instance_group
    assert (group.kind, list(group.gpus)) == (KIND.KIND_CPU, [])


# -- backend inference -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("filename", "backend", "platform", "default_filename"),
    [
        ("model.py", "python", "", "model.py"),
        ("model.onnx", "onnxruntime", "onnxruntime_onnx", "model.onnx"),
        ("model.plan", "tensorrt", "tensorrt_plan", "model.plan"),
        ("model.pt", "pytorch", "pytorch_libtorch", ""),  # Triton leaves it empty here
    ],
)
def test_backend_inferred_from_the_first_version_directory(
    tmp_path, filename, backend, platform, default_filename
):
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / filename).write_text("")
    config = mc.ModelConfig()
    autofill_backend_fields(config, "m", tmp_path)
    assert (config.name, config.backend, config.platform) == ("m", backend, platform)
    assert config.default_model_filename == default_filename


def test_unrecognised_directory_without_backend(tmp_path):
    (tmp_path / "1").mkdir()
    with pytest.raises(ConfigError) as info:
        autofill_backend_fields(mc.ModelConfig(), "plain", tmp_path)
    assert str(info.value) == (
        "Invalid model name: Could not determine backend for model 'plain' with no backend in "
        "model configuration. Expected model name of the form 'model.<backend_name>'."
    )
    config = mc.ModelConfig()
    autofill_backend_fields(config, "my.identity", tmp_path)
    assert (config.backend, config.default_model_filename) == ("identity", "model.identity")


# -- validation texts not reachable on the oracle's python models ---------------------------


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            'name: "e" platform: "ensemble" backend: "python"',
            "Ensemble model 'e' must have platform type 'ensemble' and empty backend type",
        ),
        (
            'name: "e" platform: "ensemble" version_policy {latest {num_versions: 1}}',
            "ensemble scheduling must be set for ensemble e whose platform is ensemble",
        ),
        (
            'name: "m" backend: "onnxruntime" platform: "tensorrt_plan"',
            "unexpected 'platform' and 'backend' pair, got:tensorrt_plan, onnxruntime",
        ),
        (
            'name: "m" backend: "python" version_policy {latest {num_versions: 1}} '
            "model_transaction_policy {decoupled: true} response_cache {enable: true}",
            "Response Cache does not currently support model m with 'decoupled' transaction "
            "policy. Please disable the response cache.",
        ),
        (
            'name: "m" backend: "python" version_policy {latest {num_versions: 1}} '
            "max_batch_size: 4 dynamic_batching {priority_levels: 2}",
            "default priority level must be in range [1, 2] for m",
        ),
        (
            'name: "m" backend: "python" version_policy {latest {num_versions: 1}} '
            "sequence_batching {control_input [{name: 'C' control [{kind: "
            "CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32}]}]}",
            "unexpected data type for control CONTROL_SEQUENCE_CORRID for m. Allowed data types "
            "are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING",
        ),
    ],
)
def test_model_config_validation_texts(text, reason):
    with pytest.raises(ConfigError) as info:
        validate_model_config(parse(text))
    assert str(info.value) == reason


ENSEMBLE = """
name: "ens"
platform: "ensemble"
version_policy { latest { num_versions: 1 } }
input [{name: "RAW" data_type: TYPE_STRING dims: [1]}]
output [{name: "SCORE" data_type: TYPE_FP32 dims: [1]}]
ensemble_scheduling { step [
  { model_name: "pre" model_version: -1
    input_map { key: "IN" value: "RAW" } output_map { key: "OUT" value: "TOKENS" } },
  { model_name: "net" model_version: -1
    input_map { key: "IN" value: "TOKENS" } output_map { key: "OUT" value: "SCORE" } }
] }
"""


def test_valid_ensemble_and_its_json_versions():
    config = parse(ENSEMBLE)
    validate_model_config(config)
    steps = config_to_dict(config)["ensemble_scheduling"]["step"]
    assert [s["model_version"] for s in steps] == [-1, -1]  # numbers, as Triton fixes them


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        (
            'output [{name: "SCORE"',
            'output [{name: "OTHER"',
            "ensemble output 'OTHER' for ensemble ens' is not used",
        ),
        ('value: "RAW"', 'value: "NOPE"', "ensemble input 'RAW' for ensemble ens' is not used"),
        (
            'output_map { key: "OUT" value: "TOKENS" }',
            'output_map { key: "OUT" value: "T2" }',
            "output 'SCORE' for ensemble 'ens' is not written: at least one of its depending "
            "tensors, 'TOKENS', is not connected",
        ),
        (
            'output_map { key: "OUT" value: "TOKENS" }',
            'output_map { key: "OUT" value: "TOKENS" } output_map { key: "X" value: "SPARE" }',
            "ensemble tensor 'SPARE' is unused in ensemble 'ens'",
        ),
    ],
)
def test_ensemble_data_flow_texts(old, new, reason):
    assert old in ENSEMBLE
    with pytest.raises(ConfigError) as info:
        validate_model_config(parse(ENSEMBLE.replace(old, new, 1)))
    assert str(info.value) == reason


def test_reshape_with_variable_dims():
    ok = parse(
        'name: "m" max_batch_size: 1 input [{name: "A" data_type: TYPE_FP32 dims: [2, 4, -1, 6] '
        "reshape: {shape: [8, -1, 1, 6]}}]"
    )
    validate_io_config(ok)
    bad = parse(
        'name: "m" max_batch_size: 1 input [{name: "A" data_type: TYPE_FP32 dims: [2, -1] '
        "reshape: {shape: [-1, -1]}}]"
    )
    with pytest.raises(ConfigError) as info:
        validate_io_config(bad)
    assert str(info.value) == (
        "model input 'A' has different number of variable-size dimensions for dims and reshape "
        "for m"
    )


# -- JSON form ------------------------------------------------------------------------------


def test_json_64bit_fields_follow_triton():
    config = parse(
        """
        name: "m"
        version_policy { specific { versions: [2, 5] } }
        dynamic_batching {
          max_queue_delay_microseconds: 7 priority_levels: 2 default_priority_level: 1
          default_queue_policy { default_timeout_microseconds: 9 }
          priority_queue_policy { key: 2 value: { default_timeout_microseconds: 11 } }
        }
        instance_group [{ secondary_devices [{ kind: KIND_NVDLA device_id: 3 }] }]
        model_warmup [{ name: "w" inputs { key: "IN" value: { dims: [4] zero_data: true } } }]
        """
    )
    data = config_to_dict(config)
    assert data["version_policy"] == {"specific": {"versions": [2, 5]}}
    batching = data["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == 7
    assert batching["priority_levels"] == 2
    assert batching["default_queue_policy"]["default_timeout_microseconds"] == 9
    assert batching["priority_queue_policy"]["2"]["default_timeout_microseconds"] == 11
    assert data["model_warmup"][0]["inputs"]["IN"]["dims"] == [4]
    # Not in Triton's list of fixed fields: stays a protobuf JSON string.
    assert data["instance_group"][0]["secondary_devices"][0]["device_id"] == "3"


def test_args_json_is_compact_and_keeps_declaration_order():
    text = config_to_args_json(parse('name: "m" backend: "python" max_batch_size: 2'))
    assert text.startswith('{"name":"m","platform":"","backend":"python","runtime":""')
    assert " " not in text
    assert list(json.loads(text))[-1] == "model_warmup"


def test_config_from_json_accepts_lowercase_enums_and_rejects_unknown_fields():
    config = config_from_json('{"input": [{"name": "a", "data_type": "type_fp32", "dims": [1]}]}')
    assert config.input[0].data_type == mc.TYPE_FP32
    with pytest.raises(ValueError):
        config_from_json('{"bogus": 1}')


# -- auto-complete --------------------------------------------------------------------------


def test_auto_complete_without_hook_keeps_the_config():
    config = parse('name: "m" backend: "python" max_batch_size: 2 dynamic_batching {}')
    result = apply_auto_complete(config, type("TritonPythonModel", (), {}), "m")
    assert list(result.dynamic_batching.preferred_batch_size) == [2]


def test_auto_complete_hook_may_be_a_plain_function_on_the_class():
    seen = []

    class TritonPythonModel:
        def auto_complete_config(cfg):  # no @staticmethod: called on the class, still works
            seen.append(cfg)
            cfg.set_max_batch_size(3)
            return cfg

    result = apply_auto_complete(parse('name: "m" backend: "python"'), TritonPythonModel, "m")
    assert result.max_batch_size == 3
    assert isinstance(seen[0], ModelConfig)


def test_auto_complete_cannot_switch_a_configured_scheduler():
    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(cfg):
            del cfg.as_dict()["dynamic_batching"]
            return cfg

    config = parse('name: "m" backend: "python" dynamic_batching {}')
    with pytest.raises(ConfigError) as info:
        apply_auto_complete(config, TritonPythonModel, "m")
    assert str(info.value) == "Cannot update scheduling choice from 11 to 11 when auto-completing."


def test_class_loader_errors_become_load_errors(tmp_path):
    python_model(tmp_path, "m", 'backend: "python"')
    source = repository.scan([tmp_path])[0]

    def loader(path):
        raise ImportError(f"No module named 'torch' (while importing {path.name})")

    with pytest.raises(ConfigError) as info:
        load_config(source, ConfigOptions(), loader)
    assert info.value.stage == "load"
    assert info.value.status_text.startswith(
        "Internal: ImportError: No module named 'torch' (while importing model.py)"
    )
    # The loader is not called at all with auto-complete off.
    assert load_config(source, ConfigOptions(auto_complete=False), loader).name == "m"


def test_format_python_error_lists_user_frames_innermost_first(tmp_path):
    helper = tmp_path / "user_code.py"
    helper.write_text("def inner():\n    raise KeyError('x')\n\ndef outer():\n    inner()\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import user_code

        try:
            user_code.outer()
        except KeyError as exc:
            text = format_python_error(exc)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("user_code", None)
    lines = text.split("\n")
    assert lines[0] == "KeyError: 'x'"
    assert lines[1:3] == ["", "At:"]
    assert lines[3] == f"  {helper}(2): inner"
    assert lines[4] == f"  {helper}(5): outer"


def test_sys_exit_in_auto_complete_fails_the_load():
    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(cfg):
            sys.exit(1)

    with pytest.raises(ConfigError) as info:
        apply_auto_complete(parse('name: "m" backend: "python"'), TritonPythonModel, "m")
    assert str(info.value).startswith("SystemExit: 1\n\nAt:\n")
    assert info.value.status_text.startswith("Internal: SystemExit: 1")
