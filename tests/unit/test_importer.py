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
