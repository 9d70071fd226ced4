"""model.py imports: what an import adds under the model's folder is forgotten afterwards, and
nothing else in `sys.modules` is asked more than it can answer."""

from __future__ import annotations

import sys
from pathlib import Path

from model_repository_loader.importer import import_model_module

# A model that, while it is imported, brings in a module answering every attribute with an object
# that is truthy and not iterable: what `import torch` adds as `torch.classes` (issue 24: every
# model that imported torch failed to load with "'_ClassNamespace' object is not iterable").
MODEL = '''
import sys
import types

import helper


class _Anything:
    def __bool__(self):
        return True


class _DynamicModule(types.ModuleType):
    def __getattr__(self, name):
        return _Anything()


sys.modules["dynamic_attributes_probe"] = _DynamicModule("dynamic_attributes_probe")


class TritonPythonModel:
    def execute(self, requests):
        return [helper.VALUE for _ in requests]
'''


def test_a_module_with_dynamic_attributes_does_not_break_the_import(tmp_path: Path) -> None:
    version = tmp_path / "probe" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(MODEL)
    (tmp_path / "probe" / "helper.py").write_text("VALUE = 42\n")
    try:
        module = import_model_module(version / "model.py")
        assert module.helper.VALUE == 42
        # The model's own helper is forgotten (the next import gets a fresh one); the module
        # from elsewhere stays, as any import outside the model's folder does.
        assert "helper" not in sys.modules
        assert "dynamic_attributes_probe" in sys.modules
    finally:
        sys.modules.pop("dynamic_attributes_probe", None)


TORCH_MODEL = '''
import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = torch.from_numpy(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy())
            out = pb_utils.Tensor.from_dlpack("OUTPUT0", torch.utils.dlpack.to_dlpack(x * 2))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
'''

TORCH_CONFIG = '''
backend: "python"
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }]
'''


def test_a_model_importing_real_torch_loads_on_the_first_try(tmp_path: Path) -> None:
    """The first load in a process imports torch (and so torch.classes) inside the model's
    import: the case that failed, where a second load passed because torch was then imported."""
    import subprocess
    import textwrap

    model = tmp_path / "torch_double"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(TORCH_MODEL)
    (model / "config.pbtxt").write_text(TORCH_CONFIG)
    # A fresh interpreter: torch must not be imported yet when the model is.
    script = textwrap.dedent(
        f"""
        import sys
        import numpy as np
        assert "torch" not in sys.modules
        from model_repository_loader import pb_utils
        from model_repository_loader.inference import InferRequest
        from model_repository_loader.loader import load_repository
        repo = load_repository([{str(tmp_path)!r}])
        assert not repo.failures, repo.failures
        x = np.arange(4, dtype=np.float32)
        response = repo.models["torch_double"].infer(
            InferRequest(inputs=[pb_utils.Tensor("INPUT0", x)])
        )
        print(response.output_tensors()[0].as_numpy().tolist())
        repo.close()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[0.0, 2.0, 4.0, 6.0]"
