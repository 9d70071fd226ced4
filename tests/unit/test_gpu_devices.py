"""GPU discovery without a GPU: CUDA_VISIBLE_DEVICES as CUDA reads it, the compute capability
filter, the CPU-only host, and KIND_GPU models loaded given a list of GPUs.

The host list is what NVML would report (gpu/devices.py); on this machine NVML itself finds no
driver, which is the CPU-only path every CI run takes for real.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc.model_config_pb2 import ModelInstanceGroup

from model_repository_loader.config import ConfigOptions
from model_repository_loader.gpu import devices
from model_repository_loader.gpu.devices import GpuDevice, select_visible, supported_gpu_ids
from model_repository_loader.inference import InferRequest
from model_repository_loader.loader import load_repository
from model_repository_loader.pb_utils import Tensor

KIND_GPU = ModelInstanceGroup.KIND_GPU
HOST = [
    GpuDevice(0, "GPU-aaaa1111-0000", "NVIDIA H200", 9.0, 0),
    GpuDevice(1, "GPU-bbbb2222-0000", "NVIDIA H200", 9.0, 1),
    GpuDevice(2, "GPU-cccc3333-0000", "Tesla K80", 3.7, 2),
]


def _seen(variable: str | None) -> list[tuple[int, int]]:
    """(CUDA ordinal, NVML index) of each GPU CUDA would show."""
    return [(d.index, d.nvml_index) for d in select_visible(HOST, variable)]


def test_every_gpu_without_the_variable() -> None:
    assert _seen(None) == [(0, 0), (1, 1), (2, 2)]


def test_the_variable_orders_and_renumbers() -> None:
    assert _seen("2,0") == [(0, 2), (1, 0)]
    assert _seen(" 1 ") == [(0, 1)]


def test_uuid_prefixes_are_accepted() -> None:
    assert _seen("GPU-bbbb,0") == [(0, 1), (1, 0)]


def test_the_list_ends_at_the_first_entry_naming_no_gpu() -> None:
    # As the CUDA runtime: what follows a bad entry is not seen.
    assert _seen("1,7,0") == [(0, 1)]
    assert _seen("GPU-,0") == []
    assert _seen("GPU-") == []
    assert _seen("0,0,1") == [(0, 0)]  # a repeated GPU is a bad entry too
    assert _seen("GPU-aaaa1111-0000,GPU-dddd") == [(0, 0)]


def test_an_empty_variable_hides_every_gpu() -> None:
    assert _seen("") == []
    assert _seen("-1") == []


def test_compute_capability_below_the_minimum_is_not_used() -> None:
    visible = select_visible(HOST, None)
    assert supported_gpu_ids(visible) == (0, 1)  # Triton's default minimum, 6.0
    assert supported_gpu_ids(visible, 3.5) == (0, 1, 2)
    assert supported_gpu_ids(visible, 9.5) == ()


def test_a_gpu_nvml_cannot_read_keeps_its_number_and_is_not_used() -> None:
    # As gpu/devices.py describes a GPU whose handle or properties NVML cannot read.
    host = [HOST[0], GpuDevice(1, "", "unreadable", 0.0, 1), GpuDevice(2, "GPU-b", "H200", 9.0, 2)]
    visible = select_visible(host, None)
    assert [d.index for d in visible] == [0, 1, 2]  # CUDA still numbers it
    assert supported_gpu_ids(visible, 0.0) == (0, 2)
    assert [d.index for d in select_visible(host, "2,1,0")] == [0, 1, 2]
    assert supported_gpu_ids(select_visible(host, "2,1,0"), 0.0) == (0, 2)


def _nvml_answers() -> bool:
    with devices.nvml_session() as nvml:
        return nvml is not None


@pytest.mark.skipif(_nvml_answers(), reason="NVML answers here: a GPU host")
def test_no_nvml_driver_means_no_gpus() -> None:
    # CI has NVML's Python package (the gpu extra) but no driver library.
    assert devices.visible_devices() == []


_RECORDER = """
import json
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = args

    def execute(self, requests):
        text = json.dumps({k: self.args[k] for k in (
            "model_instance_kind", "model_instance_device_id")})
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", np.array([text.encode()], dtype=np.object_))]
            )
            for _ in requests
        ]


import numpy as np
"""


def _recorder(root: Path, name: str, groups: str, parameters: str = "") -> Path:
    folder = root / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(_RECORDER)
    (folder / "config.pbtxt").write_text(
        f'backend: "python"\n{groups}\n{parameters}\n'
        'input [{name: "IN" data_type: TYPE_FP32 dims: [1]}]\n'
        'output [{name: "OUT" data_type: TYPE_STRING dims: [1]}]\n'
    )
    return root


def _instances_seen(model, calls: int) -> set[tuple[str, str]]:
    seen = set()
    for _ in range(calls):
        response = model.infer(InferRequest(inputs=[Tensor("IN", np.ones(1, np.float32))]))
        args = json.loads(response.output_tensors()[0].as_numpy()[0])
        seen.add((args["model_instance_kind"], args["model_instance_device_id"]))
    return seen


def test_a_python_model_without_groups_gets_a_gpu_instance_per_gpu(tmp_path: Path) -> None:
    root = _recorder(tmp_path, "m", "")
    repo = load_repository([root], ConfigOptions(gpu_ids=(0, 1)), only=["m"])
    try:
        model = repo.models["m"]
        groups = model.config.instance_group
        assert [(g.kind, list(g.gpus), g.count) for g in groups] == [(KIND_GPU, [0, 1], 1)]
        # Each instance was initialized with its device (the default scheduler alternates).
        assert _instances_seen(model, 8) == {("GPU", "0"), ("GPU", "1")}
    finally:
        repo.close()


def test_kind_gpu_loads_given_gpus_and_fails_without_them(tmp_path: Path) -> None:
    root = _recorder(tmp_path, "g", "instance_group [{kind: KIND_GPU gpus: [1]}]")
    _recorder(tmp_path, "any_gpu", "instance_group [{kind: KIND_GPU}]")
    repo = load_repository([root], ConfigOptions(gpu_ids=(0, 1)))
    try:
        assert _instances_seen(repo.models["g"], 2) == {("GPU", "1")}
        assert _instances_seen(repo.models["any_gpu"], 4) == {("GPU", "0"), ("GPU", "1")}
    finally:
        repo.close()
    repo = load_repository([root], ConfigOptions())  # a CPU-only host: Triton's texts
    try:
        assert not repo.models
        assert repo.failures["any_gpu"] == (
            "Invalid argument: instance group any_gpu_0 of model any_gpu has kind KIND_GPU but "
            "no GPUs are available"
        )
        assert repo.failures["g"].endswith(
            "specifies invalid or unsupported gpu id 1. GPUs "
            "with at least the minimum required CUDA compute compatibility of 6.000000 are: "
        )
    finally:
        repo.close()


@pytest.mark.parametrize("value", ["maybe", "Yes", ""])
def test_force_cpu_only_input_tensors_takes_yes_or_no(tmp_path: Path, value: str) -> None:
    parameter = 'parameters {key: "FORCE_CPU_ONLY_INPUT_TENSORS" value {string_value: "%s"}}'
    root = _recorder(tmp_path, "f", "", parameter % value)
    repo = load_repository([root], ConfigOptions(), only=["f"])
    try:
        assert "f" not in repo.models
        assert repo.failures["f"].endswith(
            f"Unsupported: Incorrect value for FORCE_CPU_ONLY_INPUT_TENSORS: {value}'"
        )
    finally:
        repo.close()
    for good in ("yes", "no"):
        (root / "f" / "config.pbtxt").write_text(
            (root / "f" / "config.pbtxt").read_text().replace(f'"{value}"', f'"{good}"')
        )
        repo = load_repository([root], ConfigOptions(), only=["f"])
        try:
            assert "f" in repo.models, repo.failures
        finally:
            repo.close()
        value = good
