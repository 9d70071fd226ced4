"""GPU tensors in pb_utils with real CUDA memory (torch; cupy and jax where installed).

Zero copy both ways, stream semantics, the host copy the wires read, memory held until the
last holder, FORCE_CPU_ONLY_INPUT_TENSORS and BLS `preferred_memory`, all in-process through
the loader (no server): what a model.py sees.
"""

from __future__ import annotations

import gc
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from model_repository_loader.config import ConfigOptions
from model_repository_loader.inference import InferRequest
from model_repository_loader.loader import load_repository
from model_repository_loader.pb_utils import Tensor, TritonModelException
from tests.harness.gpu import on_fresh_thread

torch = pytest.importorskip("torch")


def test_a_torch_cuda_tensor_goes_in_and_out_without_a_copy() -> None:
    source = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)
    tensor = Tensor.from_dlpack("OUT", source)
    assert not tensor.is_cpu()
    assert tensor.__dlpack_device__() == (2, source.device.index)
    assert tensor.shape() == [3, 4]
    back = torch.from_dlpack(tensor)
    assert back.is_cuda and back.data_ptr() == source.data_ptr()
    again = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
    assert again.data_ptr() == source.data_ptr()
    with pytest.raises(TritonModelException, match="Tensor is stored in GPU"):
        tensor.as_numpy()


def test_the_host_copy_is_what_the_wire_reads() -> None:
    source = torch.arange(6, dtype=torch.float16, device="cuda")
    tensor = Tensor.from_dlpack("OUT", source)
    np.testing.assert_array_equal(tensor._array, source.cpu().numpy())
    assert not tensor.is_cpu()  # still a GPU tensor


def test_pending_work_is_waited_for() -> None:
    # Written on a side stream, taken while it is the current one: from_dlpack hands the legacy
    # stream to __dlpack__, which orders it after the producer's current stream, and waits.
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        big = torch.ones(1 << 24, device="cuda")
        for _ in range(20):
            big = big * 1.0001
        total = big.sum()
        tensor = Tensor.from_dlpack("OUT", total.reshape(1))
    assert tensor._array[0] == pytest.approx(float(total.cpu()), rel=1e-6)


def test_a_copy_on_a_fresh_thread_leaves_it_without_a_context() -> None:
    """The loader's copies run on threads that may never have used CUDA (the door's, an
    instance process's reader): they leave such a thread as they found it, with no context
    bound, rather than with device 0's primary context made current."""
    from model_repository_loader.gpu import cuda

    source = torch.arange(4, dtype=torch.float32, device="cuda")
    seen = on_fresh_thread(
        lambda: [Tensor.from_dlpack("X", source)._array.tolist(), cuda.current_context()]
    )
    assert seen == [[0.0, 1.0, 2.0, 3.0], 0], seen


def test_a_model_that_keeps_the_tensor_keeps_the_memory() -> None:
    source = torch.full((1 << 20,), 7.0, device="cuda")
    tensor = Tensor.from_dlpack("OUT", source)
    del source
    gc.collect()
    # The caching allocator would hand freed memory to the next tensor of that size.
    other = torch.zeros(1 << 20, device="cuda")
    torch.cuda.synchronize()
    assert float(tensor._array.min()) == 7.0
    del other


def test_bf16_keeps_its_type() -> None:
    source = torch.tensor([1.0, 2.0], dtype=torch.bfloat16, device="cuda")
    tensor = Tensor.from_dlpack("B", source)
    assert tensor.triton_dtype() == 14
    assert torch.equal(torch.from_dlpack(tensor).cpu(), source.cpu())


@pytest.mark.skipif(importlib.util.find_spec("cupy") is None, reason="cupy not installed")
def test_cupy_arrays_both_ways() -> None:
    import cupy

    source = cupy.arange(5, dtype=cupy.int32)
    tensor = Tensor.from_dlpack("C", source)
    assert not tensor.is_cpu()
    back = cupy.from_dlpack(tensor)
    assert back.data.ptr == source.data.ptr


_BLS_CALLER = """
import json
import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = torch.arange(4, dtype=torch.float32, device="cuda")
            call = pb_utils.InferenceRequest(
                model_name="where", requested_output_names=["WHERE", "OUT"],
                inputs=[pb_utils.Tensor.from_dlpack("IN", x)],
                **({} if %(preferred)s is None else {"preferred_memory": %(preferred)s}))
            response = call.exec()
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            out = pb_utils.get_output_tensor_by_name(response, "OUT")
            seen = json.loads(pb_utils.get_output_tensor_by_name(response, "WHERE").as_numpy()[0])
            seen["caller_out_on_cpu"] = out.is_cpu()
            seen["out"] = torch.from_dlpack(out).cpu().tolist()
            text = np.array([json.dumps(seen).encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", text)]))
        return responses
"""

_WHERE = """
import json
import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "IN")
            seen = {"callee_in_on_cpu": tensor.is_cpu()}
            data = torch.from_dlpack(tensor).to("cuda") * 2
            text = np.array([json.dumps(seen).encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("WHERE", text), pb_utils.Tensor.from_dlpack("OUT", data)]))
        return responses
"""


def _model(root: Path, name: str, code: str, config: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(code)
    (root / name / "config.pbtxt").write_text(f'backend: "python"\n{config}')


@pytest.mark.parametrize("kind", ["thread", "process"])  # process: through CUDA IPC
@pytest.mark.parametrize(
    ("force_cpu", "preferred", "expected"),
    [
        ("yes", "pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU)", (True, True)),
        ("no", "pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 0)", (False, False)),
        ("no", "pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU)", (False, True)),
        ("no", "None", (False, False)),  # no preference: where the callee made them
    ],
)
def test_bls_gpu_inputs_and_preferred_memory(
    tmp_path: Path, force_cpu: str, preferred: str, expected: tuple[bool, bool], kind: str
) -> None:
    string_out = 'output [{name: "SEEN" data_type: TYPE_STRING dims: [1]}]\n'
    _model(
        tmp_path,
        "caller",
        _BLS_CALLER % {"preferred": preferred},
        'input [{name: "X" data_type: TYPE_FP32 dims: [1]}]\n' + string_out,
    )
    _model(
        tmp_path,
        "where",
        _WHERE,
        'parameters {key: "FORCE_CPU_ONLY_INPUT_TENSORS" '
        f'value {{string_value: "{force_cpu}"}}}}\n'
        f'parameters {{key: "BRIDGE_INSTANCE_KIND" value {{string_value: "{kind}"}}}}\n'
        'input [{name: "IN" data_type: TYPE_FP32 dims: [-1]}]\n'
        'output [{name: "WHERE" data_type: TYPE_STRING dims: [1]}, '
        '{name: "OUT" data_type: TYPE_FP32 dims: [-1]}]\n',
    )
    repo = load_repository([tmp_path], ConfigOptions(gpu_ids=(0,)))
    try:
        assert not repo.failures, repo.failures
        response = repo.models["caller"].infer(
            InferRequest(inputs=[Tensor("X", np.ones(1, np.float32))])
        )
        assert not response.has_error(), response.error()
        seen = json.loads(response.output_tensors()[0].as_numpy()[0])
        assert (seen["callee_in_on_cpu"], seen["caller_out_on_cpu"]) == expected
        np.testing.assert_array_equal(seen["out"], np.arange(4) * 2)
    finally:
        repo.close()
    assert not list(Path("/dev/shm").glob("dynamo-bridge-*/cuda-*"))  # every IPC copy taken
