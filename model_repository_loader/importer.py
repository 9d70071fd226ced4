"""Import a model.py the way Triton's stub does, many times in one process.

Triton imports `<version>/model.py` as the module `"<version>.model"` of a package rooted at the
version folder, with the version folder and the model folder on `sys.path`, once per instance
process. Here many models (all with a version "1" and often a `utils.py`) share one interpreter, so
each import runs with a private view of `sys.modules`: the package and every module loaded from the
model's folder are removed again afterwards, and live on only through the model module's globals.
The next model, or the next instance of the same model, gets its own fresh copies. That keeps
module globals per instance, as separate Triton processes would, and makes a reload pick up edited
helper modules.

Imports that run later, inside `initialize` or `execute` (a lazy `import helper`), are served by
`ModelFolderFinder`: on a thread bound to a model it searches that model's folders, last, as the
stub's appended `sys.path` entries are searched last. Such a module stays in `sys.modules` under
its plain name, so two in-process models that lazily import *different* files of the *same* name
share the first one loaded; top-level imports never do.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
import types
from pathlib import Path

from . import pb_utils

# sys.path and sys.modules are process-wide: one import at a time.
_import_lock = threading.Lock()
# The folders of the model bound to this thread (see `bind_model_folders`).
_bound = threading.local()


class ModelImportError(Exception):
    """model.py could not be imported; str() is the Triton-style reason."""


def import_model_module(model_file: Path) -> types.ModuleType:
    """Import `model_file` as `<version>.<stem>` and return the module object."""
    pb_utils.install()
    model_file = model_file.resolve()
    version_dir = model_file.parent
    model_dir = version_dir.parent
    package_name = version_dir.name
    module_name = f"{package_name}.{model_file.stem}"
    if not model_file.is_file():
        raise ModelImportError(f"Python model file not found in '{model_file}'")

    with _import_lock:
        saved_path = list(sys.path)
        saved_modules = dict(sys.modules)
        # As the stub does: the version folder, then the model folder, after everything else.
        sys.path.extend([str(version_dir), str(model_dir)])
        for name in (package_name, module_name):
            sys.modules.pop(name, None)
        try:
            package = types.ModuleType(package_name)
            package.__path__ = [str(version_dir)]
            package.__package__ = package_name
            sys.modules[package_name] = package
            spec = importlib.util.spec_from_file_location(module_name, model_file)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
            return module
        finally:
            sys.path[:] = saved_path
            _forget_modules_loaded_from(model_dir, saved_modules)


def _forget_modules_loaded_from(
    model_dir: Path, saved_modules: dict[str, types.ModuleType]
) -> None:
    """Drop what this import added under the model folder, and restore what it shadowed."""
    prefix = str(model_dir) + "/"
    for name, module in list(sys.modules.items()):
        if saved_modules.get(name) is module:
            continue
        if any(place.startswith(prefix) for place in _module_places(module)):
            del sys.modules[name]
    for name, module in saved_modules.items():
        if name not in sys.modules:
            sys.modules[name] = module


def _module_places(module: object) -> list[str]:
    """Where `module` was loaded from: its file and its package folders.

    Read from the module's own namespace, never through attribute access: some modules answer
    any attribute (`torch.classes` returns a `_ClassNamespace` for `__path__`), and anything can
    sit in `sys.modules`. Whatever is not a plain string or a list of them is no place.
    """
    namespace = getattr(module, "__dict__", None)
    if not isinstance(namespace, dict):
        return []
    places: list[str] = []
    origin = namespace.get("__file__")
    if isinstance(origin, str):
        places.append(origin)
    paths = namespace.get("__path__")
    if paths is not None and not isinstance(paths, (str, bytes)):
        try:
            places.extend(p for p in list(paths) if isinstance(p, str))
        except Exception:  # a __path__ that is no iterable of folders names none
            pass
    return places


def bind_model_folders(model_file: Path) -> None:
    """Let lazy imports on this thread find modules in `model_file`'s folders."""
    version_dir = model_file.resolve().parent
    _bound.folders = [str(version_dir), str(version_dir.parent)]
    _install_finder()


class ModelFolderFinder(importlib.abc.MetaPathFinder):
    """Finds top-level modules in the folders of the model bound to the importing thread."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        folders = getattr(_bound, "folders", None)
        if folders is None or path is not None:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, folders)


_finder = ModelFolderFinder()


def _install_finder() -> None:
    if _finder not in sys.meta_path:
        sys.meta_path.append(_finder)  # last: the stub appends its folders to sys.path
