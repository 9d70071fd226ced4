"""Per-model Python environments: `EXECUTION_ENV_PATH`, as Triton's Python backend reads it.

A model whose config has

    parameters: {
      key: "EXECUTION_ENV_PATH", value: {string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz"}
    }

runs every instance as a process started by that environment's interpreter, so it gets that
environment's packages (numpy 1.x beside the server's numpy 2, an old torch, ...). What Triton
does [S: python_be.cc, pb_env.cc, stub_launcher.cc]: `$$TRITON_MODEL_DIRECTORY` becomes the
model's folder; a folder is used as it is; an archive (conda-pack's `.tar.gz`) is unpacked; the
environment must hold `bin/activate`. Here also:

* a relative path is relative to the model's folder;
* a plain venv (or a uv-made one) is accepted as well as a conda environment: the interpreter
  is `bin/python3` (or `bin/python`), and `bin/activate` is not required;
* an archive is unpacked once into a cache keyed by its content (SHA-256, not its path or
  mtime), shared by every instance, model, reload and restart of the server: folder
  `<cache>/<sha256>`, which exists only once complete (it is unpacked beside it and renamed
  into place, under a file lock). A half-unpacked folder left by a crash is never used, and is
  removed by the next unpack. conda-pack's `bin/conda-unpack` is run once after unpacking, as
  its documentation asks;
* the interpreter is checked once: Python 3.10 or newer (what this package's instance process
  needs) with numpy importable, else the model fails to load saying which and why.

The instance process imports only `model_repository_loader` (no Dynamo, gRPC or tritonclient):
it is put on the environment's path through a folder holding nothing else (`loader_path()`),
so the environment's own packages are the ones the model sees.

The cache: `DYN_BRIDGE_ENVIRONMENT_CACHE`, else `$XDG_CACHE_HOME/dynamo-bridge/environments`,
else `~/.cache/dynamo-bridge/environments`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelLoadError

PARAMETER = "EXECUTION_ENV_PATH"
MODEL_DIRECTORY = "$$TRITON_MODEL_DIRECTORY"
CACHE_ENV = "DYN_BRIDGE_ENVIRONMENT_CACHE"
# The oldest Python this package's instance process runs on (dataclass slots, `X | Y` unions).
OLDEST_PYTHON = (3, 10)
# How long the interpreter check may take (an environment on a slow disk imports numpy slowly).
CHECK_TIMEOUT_S = 120.0
_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")


@dataclass(frozen=True)
class ExecutionEnvironment:
    """An environment ready to run instances: its folder and its interpreter."""

    root: Path
    python: Path

    def process_environment(self, base: dict[str, str]) -> dict[str, str]:
        """What `bin/activate` would set, plus this package on the path and nothing else."""
        env = dict(base)
        env["PATH"] = os.pathsep.join(filter(None, [str(self.root / "bin"), env.get("PATH")]))
        env["VIRTUAL_ENV"] = env["CONDA_PREFIX"] = str(self.root)
        env["PYTHONPATH"] = str(loader_path())
        env.pop("PYTHONHOME", None)
        return env


def environment_parameter(parameters: dict[str, str], model_dir: Path) -> Path | None:
    """The environment a model names (`EXECUTION_ENV_PATH`, resolved), or None."""
    value = parameters.get(PARAMETER)
    if not value:
        return None
    value = value.replace(MODEL_DIRECTORY, str(model_dir))
    path = Path(value)
    return path if path.is_absolute() else model_dir / path


_prepared: dict[Path, ExecutionEnvironment] = {}
_prepared_lock = threading.Lock()
_folder_locks: dict[Path, threading.Lock] = {}


def prepare(path: Path) -> ExecutionEnvironment:
    """The environment at `path` (a folder or an archive), unpacked and checked; raises
    ModelLoadError naming the path and the reason. Safe to call from many loads at once."""
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):
        raise ModelLoadError(
            f"Internal: Failed to get the canonical path for {path}: no such file or folder"
        ) from None
    if real.is_dir():
        root = real
    elif real.name.endswith(_ARCHIVE_SUFFIXES):
        root = _unpacked(real)
    else:
        raise ModelLoadError(
            f"Internal: {PARAMETER} '{path}' is neither a folder nor a .tar.gz / .tgz / .tar "
            "archive of a Python environment"
        )
    with _prepared_lock:
        known = _prepared.get(root)
        lock = _folder_locks.setdefault(root, threading.Lock())
    if known is not None:
        return known
    with lock:  # one check per environment, whoever asks first
        with _prepared_lock:
            known = _prepared.get(root)
        if known is not None:
            return known
        environment = ExecutionEnvironment(root, _interpreter(root, path))
        _check(environment, path)
        with _prepared_lock:
            _prepared[root] = environment
        return environment


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dynamo-bridge" / "environments"


def content_key(archive: Path) -> str:
    """The SHA-256 of the archive's bytes: the name of its unpacked folder in the cache."""
    digest = hashlib.sha256()
    with open(archive, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _unpacked(archive: Path) -> Path:
    cache = cache_root()
    try:
        cache.mkdir(parents=True, exist_ok=True)
        key = content_key(archive)
    except OSError as exc:
        raise ModelLoadError(
            f"Internal: cannot read the Python environment '{archive}': {exc}"
        ) from None
    target = cache / key
    if target.is_dir():
        return target  # complete: only a finished unpack is renamed to this name
    with open(cache / f"{key}.lock", "w") as lock_file:
        # Another process (or load) unpacking the same content finishes first; we then reuse it.
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        if target.is_dir():
            return target
        for leftover in cache.glob(f"{key}.partial-*"):
            shutil.rmtree(leftover, ignore_errors=True)  # a crash's half-unpacked folder
        partial = Path(tempfile.mkdtemp(prefix=f"{key}.partial-", dir=cache))
        try:
            with tarfile.open(archive) as tar:
                tar.extractall(partial, filter="tar")
            _conda_unpack(partial, archive)
            os.replace(partial, target)
        except (OSError, tarfile.TarError, EOFError) as exc:
            shutil.rmtree(partial, ignore_errors=True)
            raise ModelLoadError(
                f"Internal: failed to unpack the Python environment '{archive}': {exc}"
            ) from None
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    return target


def _conda_unpack(folder: Path, archive: Path) -> None:
    script = folder / "bin" / "conda-unpack"
    if not script.exists():
        return
    python = _interpreter(folder, archive)
    done = subprocess.run(
        [str(python), str(script)], capture_output=True, text=True, timeout=CHECK_TIMEOUT_S
    )
    if done.returncode != 0:
        raise OSError(f"bin/conda-unpack failed: {done.stderr.strip()[-2000:]}")


def _interpreter(root: Path, named: Path) -> Path:
    for candidate in ("bin/python3", "bin/python"):
        python = root / candidate
        if python.exists():
            return python
    raise ModelLoadError(
        f"Internal: the Python environment '{named}' has no bin/python3 or bin/python"
    )


_CHECK = (
    "import json, sys\n"
    "answer = {'version': list(sys.version_info[:3])}\n"
    "try:\n"
    "    import numpy\n"
    "    answer['numpy'] = numpy.__version__\n"
    "except Exception as exc:\n"
    "    answer['numpy_error'] = f'{type(exc).__name__}: {exc}'\n"
    "print(json.dumps(answer))\n"
)


def _check(environment: ExecutionEnvironment, named: Path) -> None:
    try:
        done = subprocess.run(
            [str(environment.python), "-c", _CHECK],
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            env=environment.process_environment(dict(os.environ)),
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise ModelLoadError(
            f"Internal: the interpreter of the Python environment '{named}' does not start: {exc}"
        ) from None
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise ModelLoadError(
            f"Internal: the interpreter of the Python environment '{named}' does not start: "
            f"{(done.stderr or done.stdout).strip()[-2000:]}"
        ) from None
    version = tuple(answer["version"])
    if version[:2] < OLDEST_PYTHON:
        raise ModelLoadError(
            f"Internal: the Python environment '{named}' has Python "
            f"{'.'.join(map(str, version))}; model instances need Python "
            f"{'.'.join(map(str, OLDEST_PYTHON))} or newer"
        )
    if "numpy" not in answer:
        raise ModelLoadError(
            f"Internal: the Python environment '{named}' cannot import numpy, which "
            f"triton_python_backend_utils needs: {answer.get('numpy_error')}"
        )


_loader_path_lock = threading.Lock()


def loader_path() -> Path:
    """A folder holding only a link to this package: an instance process in another
    environment imports the loader from it, and nothing else of the server's."""
    package = Path(__file__).resolve().parents[1]
    tag = hashlib.sha256(str(package).encode()).hexdigest()[:12]
    folder = Path(tempfile.gettempdir()) / f"dynamo-bridge-loader-{os.getuid()}-{tag}"
    link = folder / package.name
    with _loader_path_lock:
        folder.mkdir(mode=0o700, exist_ok=True)
        # A folder in /tmp that another user made first would decide what our instances import.
        info = folder.lstat()
        if info.st_uid != os.getuid() or info.st_mode & 0o022 or folder.is_symlink():
            raise ModelLoadError(
                f"Internal: {folder} is not a private folder of this user; remove it"
            )
        if link.is_symlink() and link.resolve() == package:
            return folder
        temporary = folder / f".{package.name}.{os.getpid()}"
        if temporary.is_symlink() or temporary.exists():
            temporary.unlink()
        temporary.symlink_to(package, target_is_directory=True)
        os.replace(temporary, link)
    return folder
