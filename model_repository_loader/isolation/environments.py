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
* unpacking follows Triton's stub's rules, and stricter ones (`archives.py`: nothing lands
  outside the folder, no device, FIFO or setuid bit), within `EnvironmentLimits` (bytes and
  members of one archive);
* the cache is bounded (`EnvironmentLimits.cache_bytes`): past the bound, the unpacked
  environments no process uses are removed, least recently used first. A process uses one
  from `prepare` to `release` (a model version: from its load to its unload), and says so to
  every other process by a shared flock on the folder, which an eviction must lock exclusively
  first. The bytes each one took are kept in its `<sha>.lock`; its folder's mtime is its last
  use;
* the interpreter is checked once: Python 3.10 or newer (what this package's instance process
  needs) with numpy importable, else the model fails to load saying which and why.

The instance process imports only `model_repository_loader` (no Dynamo, gRPC or tritonclient):
it is put on the environment's path through a folder holding nothing else (`loader_path()`),
so the environment's own packages are the ones the model sees.

The cache: `DYN_BRIDGE_ENVIRONMENT_CACHE`, else `$XDG_CACHE_HOME/dynamo-bridge/environments`,
else `~/.cache/dynamo-bridge/environments`. What it holds is run as the server's user, so it
must be the server's alone (issue 38, finding 2): made 0700 by that user if missing, and
refused (the model is not loaded; the error names the folder and why) when it, or any folder
on its path, lets another user change what it holds (`private_folder`, which `loader_path()`'s
folder in /tmp passes too). Its `<sha>.lock` is opened inside it, never through a symlink.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import logging
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
import threading
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import ModelLoadError
from . import archives

log = logging.getLogger(__name__)

PARAMETER = "EXECUTION_ENV_PATH"
MODEL_DIRECTORY = "$$TRITON_MODEL_DIRECTORY"
CACHE_ENV = "DYN_BRIDGE_ENVIRONMENT_CACHE"
# The oldest Python this package's instance process runs on (dataclass slots, `X | Y` unions).
OLDEST_PYTHON = (3, 10)
# How long the interpreter check may take (an environment on a slow disk imports numpy slowly).
CHECK_TIMEOUT_S = 120.0
_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")
# Sized for conda-pack's archives: an environment with torch and CUDA unpacks to 5-10 GB in
# some 10^4-10^5 files; the limits leave room for one twice as large.
DEFAULT_MAX_BYTES = 16 << 30
DEFAULT_MAX_FILES = 500_000
DEFAULT_CACHE_BYTES = 64 << 30


@dataclass(frozen=True)
class EnvironmentLimits:
    """How large an archive may unpack, and the cache grow (bridge/cli.py's flags
    `--environment-max-bytes`, `--environment-max-files`, `--environment-cache-max-bytes`).

    max_bytes, max_files: the most one archive may unpack to, in its files' bytes and in
        members (folders and links count); past either the model is not loaded and nothing of
        the unpack is kept.
    cache_bytes: once the cache's unpacked environments add up to more, those that no process
        uses are removed, least recently used first.
    """

    max_bytes: int = DEFAULT_MAX_BYTES
    max_files: int = DEFAULT_MAX_FILES
    cache_bytes: int = DEFAULT_CACHE_BYTES


# A limit as the operator sets it (bridge/cli.py), named in the load error it causes.
_LIMIT_FLAGS = {"bytes": "--environment-max-bytes", "files": "--environment-max-files"}


@dataclass(frozen=True)
class ExecutionEnvironment:
    """An environment ready to run instances: its folder and its interpreter; `archive`, the
    archive it was unpacked from (None for a folder), when it is held in the cache."""

    root: Path
    python: Path
    archive: Path | None = None

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


def prepare(path: Path, limits: EnvironmentLimits = EnvironmentLimits()) -> ExecutionEnvironment:
    """The environment at `path` (a folder or an archive), unpacked and checked; raises
    ModelLoadError naming the path and the reason. Safe to call from many loads at once.

    An archive's environment is held in the cache (never evicted) until `release` is given what
    this returned, once for each call."""
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):
        raise ModelLoadError(
            f"Internal: Failed to get the canonical path for {path}: no such file or folder"
        ) from None
    if real.is_dir():
        return _checked_environment(real, path)
    if not real.name.endswith(_ARCHIVE_SUFFIXES):
        raise ModelLoadError(
            f"Internal: {PARAMETER} '{path}' is neither a folder nor a .tar.gz / .tgz / .tar "
            "archive of a Python environment"
        )
    root = _unpacked(real, limits)
    try:
        return replace(_checked_environment(root, path), archive=real)
    except BaseException:
        _let_go(root)
        raise


def release(environment: ExecutionEnvironment) -> None:
    """What `prepare` returned is no longer used by its caller: an unpacked environment that
    nothing in this process uses any more may be evicted from the cache (and may be, now)."""
    if environment.archive is not None:
        _let_go(environment.root)


def _checked_environment(root: Path, named: Path) -> ExecutionEnvironment:
    """The environment in the folder `root`, its interpreter checked once per process."""
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
        environment = ExecutionEnvironment(root, _interpreter(root, named))
        _check(environment, named)
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


@dataclass
class _Hold:
    """This process's use of an unpacked environment: its folder kept open and share-locked
    (flock), which every process's eviction respects, for as many `prepare`s as `count`."""

    fd: int
    count: int
    cache: Path
    cache_bytes: int


_holds: dict[Path, _Hold] = {}
_holds_lock = threading.Lock()


def _unpacked(archive: Path, limits: EnvironmentLimits) -> Path:
    """`<cache>/<sha256>`, `archive` unpacked there first if missing, and held (`_Hold`)."""
    cache = private_folder(cache_root())
    try:
        key = content_key(archive)
    except OSError as exc:
        raise ModelLoadError(
            f"Internal: cannot read the Python environment '{archive}': {exc}"
        ) from None
    target = cache / key
    if _hold_again(target):
        return target
    try:
        fd = _open_held(target)
        unpacked = fd is None
        if fd is None:
            fd = _unpack_held(archive, cache, key, limits)
    except OSError as exc:
        raise ModelLoadError(
            f"Internal: cannot use the environment cache '{cache}': {exc}"
        ) from None
    _hold(target, fd, limits.cache_bytes)
    if unpacked:
        _evict(cache, limits.cache_bytes)  # the cache may have grown past its bound
    return target


def _hold_again(target: Path) -> bool:
    with _holds_lock:
        hold = _holds.get(target)
        if hold is not None:
            hold.count += 1
        return hold is not None


def _hold(target: Path, fd: int, cache_bytes: int) -> None:
    with _holds_lock:
        hold = _holds.get(target)
        if hold is None:
            _holds[target] = _Hold(fd, 1, target.parent, cache_bytes)
            return
        hold.count += 1  # another load of this process held it meanwhile: one lock is enough
    os.close(fd)


def _let_go(target: Path) -> None:
    with _holds_lock:
        hold = _holds[target]
        hold.count -= 1
        if hold.count:
            return
        del _holds[target]
        _touch(hold.fd)  # its last use: the eviction's order
        os.close(hold.fd)
    _evict(hold.cache, hold.cache_bytes)


def _open_held(target: Path) -> int | None:
    """The complete unpack `target`, open and share-locked; None when missing. Checked to be
    still at that name once locked: an eviction renames a folder away before it lets go."""
    try:
        fd = _share_locked(target)
    except FileNotFoundError:
        return None
    if _same_file(fd, target):
        _touch(fd)
        return fd
    os.close(fd)
    return None


def _share_locked(folder: Path) -> int:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits only for an eviction that has it
    except BaseException:
        os.close(fd)
        raise
    return fd


def _same_file(fd: int, path: Path) -> bool:
    try:
        named = path.lstat()
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _touch(fd: int) -> None:
    try:
        os.utime(fd)
    except OSError:
        pass  # a read-only cache: the order of eviction is then the unpacks'


def _unpack_held(archive: Path, cache: Path, key: str, limits: EnvironmentLimits) -> int:
    """Unpack `archive` into `<cache>/<key>`, unless another process or load did meanwhile;
    held (`_open_held`) from the moment it has that name, so no eviction takes it first."""
    target = cache / key
    with _lock_file(cache, key) as lock_file:
        # Another process (or load) unpacking the same content finishes first; we then reuse it.
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        fd = _open_held(target)
        if fd is not None:
            return fd
        _remove_leftovers(cache, key)
        partial = Path(tempfile.mkdtemp(prefix=f"{key}.partial-", dir=cache))
        try:
            _record_size(lock_file, _unpack(archive, partial, limits))
            fd = _share_locked(partial)
            try:
                os.replace(partial, target)
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        try:
            # In its final place: conda-pack's fix-up writes the folder it runs from into the
            # environment's files. Still under the exclusive lock, so nobody uses it before.
            _conda_unpack(target, archive)
        except BaseException:
            os.close(fd)
            shutil.rmtree(target, ignore_errors=True)
            raise
        _touch(fd)
        return fd


def _remove_leftovers(cache: Path, key: str) -> None:
    """A crash's half-unpacked or half-evicted folders of `key` (its lock file is held)."""
    for leftover in cache.glob(f"{key}.partial-*"):
        shutil.rmtree(leftover, ignore_errors=True)


def _unpack(archive: Path, folder: Path, limits: EnvironmentLimits) -> int:
    """`archive` unpacked into `folder` (archives.py); the bytes its files took. ModelLoadError
    naming the archive and the rule or limit it broke."""
    try:
        size = archives.unpack(archive, folder, limits.max_bytes, limits.max_files)
    except archives.TooLarge as exc:
        raise ModelLoadError(
            f"Internal: the Python environment '{archive}' unpacks to {exc}, past the limit "
            f"({_LIMIT_FLAGS[exc.what]})"
        ) from None
    except (archives.Refused, OSError, tarfile.TarError, EOFError) as exc:
        raise ModelLoadError(
            f"Internal: failed to unpack the Python environment '{archive}': {exc}"
        ) from None
    return size


def _record_size(lock_file: io.FileIO, size: int) -> None:
    """An unpacked environment's size, kept in its lock file: the eviction adds them up."""
    os.ftruncate(lock_file.fileno(), 0)
    os.pwrite(lock_file.fileno(), str(size).encode(), 0)


def _recorded_size(cache: Path, key: str) -> int:
    """What `_record_size` kept; measured (and kept) for a folder unpacked before sizes were."""
    with _lock_file(cache, key) as lock_file:
        text = os.pread(lock_file.fileno(), 32, 0)
        if text.isdigit():
            return int(text)
        size = _measured(cache / key)
        _record_size(lock_file, size)
        return size


def _measured(folder: Path) -> int:
    total = 0
    for parent, _, files in os.walk(folder):
        for name in files:
            info = os.lstat(os.path.join(parent, name))
            total += info.st_size if stat.S_ISREG(info.st_mode) else 0
    return total


def _evict(cache: Path, limit: int) -> None:
    """Remove unpacked environments that no process holds, least recently used first, until
    the cache's holds `limit` bytes at most. A held one is never removed: the cache may stay
    above its bound while its environments are in use. Never fails a load or an unload."""
    try:
        entries = sorted(_entries(cache))
        total = sum(size for _, _, size in entries)
        for _, key, size in entries:
            if total <= limit:
                break
            if _evict_one(cache, key):
                log.info("evicted the unused Python environment '%s' from the cache", key)
                total -= size
    except (OSError, ModelLoadError) as exc:
        log.warning("evicting from the environment cache '%s' failed: %s", cache, exc)


def _entries(cache: Path) -> list[tuple[float, str, int]]:
    """Each complete unpack in the cache: (its last use, its key, its size)."""
    found = []
    for path in cache.iterdir():
        if not _is_key(path.name):
            continue
        info = path.lstat()
        if stat.S_ISDIR(info.st_mode):
            found.append((info.st_mtime, path.name, _recorded_size(cache, path.name)))
    return found


def _is_key(name: str) -> bool:
    return len(name) == 64 and all(c in "0123456789abcdef" for c in name)


def _evict_one(cache: Path, key: str) -> bool:
    """Remove `<cache>/<key>` unless it is held, or being unpacked, checked or evicted."""
    target = cache / key
    with _lock_file(cache, key) as lock_file:
        if not _try_exclusive(lock_file.fileno()):
            return False
        try:
            fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            if not (_try_exclusive(fd) and _same_file(fd, target)):
                return False  # a process holds it
            _remove_leftovers(cache, key)
            doomed = cache / f"{key}.partial-evicted"
            os.rename(target, doomed)  # gone by name before anyone may share-lock it again
        finally:
            os.close(fd)
    shutil.rmtree(doomed, ignore_errors=True)
    return True


def _try_exclusive(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _lock_file(cache: Path, key: str) -> io.FileIO:
    """`<cache>/<key>.lock`, opened relative to the cache's own descriptor and never through a
    symlink: a link put there must not make us create or truncate a file elsewhere."""
    name = f"{key}.lock"
    try:
        folder = os.open(cache, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            fd = os.open(
                name,
                os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=folder,
            )
        finally:
            os.close(folder)
    except OSError as exc:
        raise ModelLoadError(
            f"Internal: cannot open the lock '{cache / name}' of the environment cache: {exc}"
        ) from None
    return io.FileIO(fd, "r+")


def _conda_unpack(folder: Path, archive: Path) -> None:
    """conda-pack's `bin/conda-unpack`, when the archive has one: it rewrites the prefixes the
    environment was packed with into `folder`, where it now lives."""
    script = folder / "bin" / "conda-unpack"
    if not script.exists():
        return
    python = _interpreter(folder, archive)
    try:
        done = subprocess.run(
            [str(python), str(script)], capture_output=True, text=True, timeout=CHECK_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ModelLoadError(
            f"Internal: failed to unpack the Python environment '{archive}': {exc}"
        ) from None
    if done.returncode != 0:
        raise ModelLoadError(
            f"Internal: failed to unpack the Python environment '{archive}': bin/conda-unpack "
            f"failed: {done.stderr.strip()[-2000:]}"
        )


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


def _not_trusted_owner(info: os.stat_result) -> str | None:
    """Why an entry on the path to a private folder is another user's (None: root's or ours)."""
    if info.st_uid in (0, os.geteuid()):
        return None
    return f"is owned by uid {info.st_uid}, neither this user ({os.geteuid()}) nor root"


def _why_not_above(info: os.stat_result) -> str | None:
    """Why a folder on the path to a private one lets another user replace what lies below it
    (None: it does not). Root's folders and ours are trusted; one that others may write into
    only if it is sticky (/tmp): they can then add entries but not rename or remove ours."""
    why = _not_trusted_owner(info)
    if why is None and info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
        why = f"is writable by other users (mode {stat.filemode(info.st_mode)})"
    return why


def _why_not_private(info: os.stat_result) -> str | None:
    """Why a folder is not this user's alone to change (None: it is)."""
    if info.st_uid != os.geteuid():
        return f"is owned by uid {info.st_uid}, not by this user ({os.geteuid()})"
    if info.st_mode & 0o022:
        return f"is writable by other users (mode {stat.filemode(info.st_mode)})"
    return None


class _Untrusted(Exception):
    """An entry on the path to a private folder that another user controls: (path, why)."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(path, why)
        self.path = path
        self.why = why


# Linux's limit on symlinks followed in one path (MAXSYMLINKS).
_MAX_LINKS = 40


def _resolved(folder: Path) -> Path:
    """`folder`'s real path, as the kernel resolves it, refusing (_Untrusted) a symlink met on
    the way that another user owns: in a sticky folder such as /tmp its owner may replace it
    at any time, and point our folder wherever they like. Missing components stay as named."""
    path = Path("/")
    pending = list(Path(os.getcwd(), folder).parts[1:])
    links = 0
    while pending:
        name = pending.pop(0)
        if name == "..":
            path = path.parent  # `path` is real: its parent is the kernel's ".."
            continue
        candidate = path / name
        try:
            info = candidate.lstat()
        except FileNotFoundError:
            path = candidate
            continue
        if not stat.S_ISLNK(info.st_mode):
            path = candidate
            continue
        why = _not_trusted_owner(info)
        if why is not None:
            raise _Untrusted(candidate, f"(a symbolic link) {why}")
        links += 1
        if links > _MAX_LINKS:
            raise _Untrusted(candidate, "leads through too many symbolic links")
        target = Path(os.readlink(candidate))
        if target.is_absolute():
            path = Path("/")
        pending[:0] = target.parts[1:] if target.is_absolute() else target.parts
    return path


def _folder_info(path: Path) -> os.stat_result:
    """lstat of the folder `path`, made 0700 first when missing."""
    try:
        return _a_folder(path, path.lstat())
    except FileNotFoundError:
        pass
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass  # made meanwhile (another load): checked as any other
    return _a_folder(path, path.lstat())


def _a_folder(path: Path, info: os.stat_result) -> os.stat_result:
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(f"'{path}' is not a folder")
    return info


def _checked(real: Path) -> None:
    """Every folder of `real` (no symlink in it) made if missing and checked, from the root
    down: nothing is made inside a folder that failed."""
    for path in (*reversed(real.parents), real):
        info = _folder_info(path)
        why = _why_not_private(info) if path == real else _why_not_above(info)
        if why is not None:
            raise _Untrusted(path, why)


def private_folder(folder: Path) -> Path:
    """`folder` as its real path (the one to use from then on), made 0700 by this user if
    missing (its missing parents too), after checking that no other user can change what it
    holds: it must be ours and writable by us alone; every folder above it root's or ours
    and writable by nobody else unless sticky; every symlink on the way root's or ours.
    Otherwise ModelLoadError naming the folder, the path at fault and why: what such a folder
    holds decides what our processes run (a `bin/python3` planted in an environment cache, a
    package link in /tmp)."""
    try:
        real = _resolved(folder)
        _checked(real)
    except _Untrusted as untrusted:
        raise ModelLoadError(
            f"Internal: '{folder}' is not a private folder of this user: '{untrusted.path}' "
            f"{untrusted.why}; fix or remove it"
        ) from None
    except OSError as exc:
        raise ModelLoadError(f"Internal: cannot use the folder '{folder}': {exc}") from None
    return real


_loader_path_lock = threading.Lock()


def loader_path() -> Path:
    """A folder holding only a link to this package: an instance process in another
    environment imports the loader from it, and nothing else of the server's."""
    package = Path(__file__).resolve().parents[1]
    tag = hashlib.sha256(str(package).encode()).hexdigest()[:12]
    named = Path(tempfile.gettempdir()) / f"dynamo-bridge-loader-{os.getuid()}-{tag}"
    with _loader_path_lock:
        # A folder in /tmp that another user made first would decide what our instances import.
        folder = private_folder(named)
        link = folder / package.name
        if link.is_symlink() and link.resolve() == package:
            return folder
        temporary = folder / f".{package.name}.{os.getpid()}"
        if temporary.is_symlink() or temporary.exists():
            temporary.unlink()
        temporary.symlink_to(package, target_is_directory=True)
        os.replace(temporary, link)
    return folder
