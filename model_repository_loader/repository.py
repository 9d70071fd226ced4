"""Model repositories on disk: model directories, version directories, model files.

Follows Triton's rules: every subdirectory of a repository is a model; a model name found in
two repositories is an error for that model only; version directories are parsed the way
Triton parses them (`std::stoll` on the name, so "3_old" is version 3, while "01" and "abc"
are ignored with a warning); `version_policy` picks which versions load.

A name or path that comes from outside (a model name given to the loading API, a file of an
override, `default_model_filename`) never leaves its model folder: `invalid_model_name` and
`model_file` refuse what would.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from .config.errors import ConfigError
from .pb_utils.errors import ErrorCode

logger = logging.getLogger(__name__)

CONFIG_FILENAME = "config.pbtxt"
DEFAULT_MODEL_FILENAME = "model.py"

# Subdirectories of a model directory Triton never treats as versions.
_NOT_VERSION_DIRS = {"warmup", "initial_state"}
# Directory names we skip in a repository although Triton would try (and fail) to load them
# as models: hidden folders (.git, .ipynb_checkpoints) and Python caches.
_SKIPPED_MODEL_DIRS = {"__pycache__"}
# What std::stoll accepts at the start of a string: optional blanks, a sign, digits.
_STOLL_PREFIX = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")
_INT64_MAX = 2**63 - 1
# A model name becomes one folder name: no longer than a file name may be on common filesystems.
MAX_MODEL_NAME_BYTES = 255


@dataclass(frozen=True)
class ModelSource:
    """One model directory found in a repository.

    `error` is set when the directory cannot be a model at all (today: its name is not unique
    across the repositories); loading such a source raises it.
    """

    name: str
    path: Path
    repository: Path
    error: ConfigError | None = None

    def version_path(self, version: int) -> Path:
        return self.path / str(version)


def scan(repository_paths: Iterable[Path | str]) -> list[ModelSource]:
    """Every model directory of the given repositories, sorted by name.

    A name present in more than one repository comes back once, with `error` set, as Triton
    refuses to load it ("not unique across all model repositories") but loads the others.
    """
    found: dict[str, list[ModelSource]] = {}
    for repository in repository_paths:
        repository = Path(repository).absolute()
        if not repository.is_dir():
            raise FileNotFoundError(f"model repository '{repository}' does not exist")
        for child in repository.iterdir():
            if (
                not child.is_dir()
                or child.name.startswith(".")
                or child.name in _SKIPPED_MODEL_DIRS
            ):
                continue
            found.setdefault(child.name, []).append(ModelSource(child.name, child, repository))

    sources = []
    for name in sorted(found):
        first, *others = found[name]
        if others:
            error = ConfigError(
                f"failed to poll model '{name}': not unique across all model repositories",
                code=ErrorCode.INVALID_ARG,
                stage="poll",
            )
            first = ModelSource(first.name, first.path, first.repository, error)
        sources.append(first)
    return sources


def invalid_model_name(name: str) -> str | None:
    """Why `name` cannot name a model folder (a reason with Triton's wording), or None.

    A model name must be one safe path segment: not empty, not "." or "..", no "/" or NUL, at
    most 255 bytes in UTF-8. Triton refuses "/" and ".." (INVALID_ARG) with the texts used here;
    the other cases are ours, in the same form. A "\\" is one more character of a POSIX name:
    a Python model's is refused later, as the stub's (`config.validate.validate_stub_name`).
    """
    trimmed = name.strip()
    if not trimmed:
        return "Model name cannot be empty. Please enter a valid name to deploy."
    if trimmed in (".", "..") or "/" in name:
        return f"invalid model name '{name}', model name must not contain path traversal characters"
    if "\0" in name:
        shown = name.replace("\0", "\\0")
        return f"invalid model name '{shown}', model name must not contain NUL characters"
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_MODEL_NAME_BYTES:
        return (
            f"invalid model name '{name[:64]}...', model name must be at most "
            f"{MAX_MODEL_NAME_BYTES} bytes (got {size})"
        )
    return None


def within(folder: Path, relative: str | Path) -> bool:
    """True if `folder / relative`, with "." and ".." resolved lexically (symlinks kept), is
    inside `folder`; an absolute `relative` is outside.

    Lexical on purpose: a repository may link a model file to a shared one elsewhere; what must
    not happen is a name or a config value climbing out of the folder.
    """
    return Path(os.path.normpath(folder / relative)).is_relative_to(os.path.normpath(folder))


def parse_version(directory_name: str) -> int | None:
    """The version number Triton reads from a version directory name, or None to skip it."""
    if directory_name in _NOT_VERSION_DIRS:
        return None
    if len(directory_name) > 1 and directory_name.startswith("0"):
        logger.warning(
            "ignore version directory '%s' which contains leading zeros in its directory name",
            directory_name,
        )
        return None
    match = _STOLL_PREFIX.match(directory_name)
    if match is None:
        logger.warning(
            "ignore version directory '%s' which fails to convert to integral number",
            directory_name,
        )
        return None
    version = int(match.group(1))
    if abs(version) > _INT64_MAX:
        logger.warning(
            "ignore version directory '%s' which fails to convert to integral number",
            directory_name,
        )
        return None
    return version


def list_versions(source: ModelSource) -> list[int]:
    """All versions present in the model directory, ascending."""
    versions = set()
    for child in source.path.iterdir():
        if child.is_dir():
            version = parse_version(child.name)
            if version is not None:
                versions.add(version)
    return sorted(versions)


def select_versions(source: ModelSource, config: mc.ModelConfig) -> list[int]:
    """The versions `config.version_policy` loads, ascending.

    Raises ConfigError (stage "versions") when none is available, with Triton's text.
    """
    available = list_versions(source)
    policy = config.version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "specific":
        selected = set()
        for version in policy.specific.versions:
            if version in available:
                selected.add(version)
            else:
                logger.error(
                    "version %d is specified for model '%s', but the version directory is not "
                    "present",
                    version,
                    source.name,
                )
        chosen = sorted(selected)
    elif which == "all":
        chosen = available
    else:
        # latest (also the default when no policy is set)
        count = policy.latest.num_versions if which == "latest" else 1
        chosen = available[max(0, len(available) - count) :] if count > 0 else []
    if not chosen:
        raise ConfigError(
            "at least one version must be available under the version policy of model "
            f"'{source.name}'",
            code=ErrorCode.INVALID_ARG,
            stage="versions",
        )
    return chosen


def model_file(source: ModelSource, version: int, config: mc.ModelConfig) -> Path:
    """`<model dir>/<version>/<default_model_filename>`; a missing file is a load error, and so
    is a filename that leads out of the model folder (absolute, or climbing with "..")."""
    filename = config.default_model_filename or DEFAULT_MODEL_FILENAME
    path = source.version_path(version) / filename
    if "\0" in filename or not within(source.path, Path(str(version), filename)):
        raise ConfigError(
            f"invalid default_model_filename '{filename}': the model file must stay within "
            f"the model directory '{source.path}'",
            code=ErrorCode.INVALID_ARG,
            stage="load",
        )
    if not path.exists():
        raise ConfigError(
            f"Failed to preinitialize Python stub: Python model file not found in '{path}'",
            code=ErrorCode.INTERNAL,
            stage="load",
        )
    return path


def config_path(source: ModelSource, model_config_name: str = "") -> Path:
    """The configuration file Triton reads: configs/<name>.pbtxt when asked for and present."""
    if model_config_name:
        custom = source.path / "configs" / f"{model_config_name}.pbtxt"
        if custom.is_file():
            return custom
    return source.path / CONFIG_FILENAME


# -- what makes up a model's content (for reload decisions) -------------------------------------

# Names that never belong to a model's content: Python caches, editor swap/backup/lock files and
# partial downloads. Triton's poll mode reacts to these (a `__pycache__` written by the model's own
# import triggers a reload); here they are not part of the model at all.
_IGNORED_DIRS = frozenset({"__pycache__", ".git", ".hg", ".svn", ".ipynb_checkpoints"})
_IGNORED_SUFFIXES = (
    ".pyc",
    ".pyo",
    ".swp",
    ".swo",
    ".swx",
    ".tmp",
    ".temp",
    ".part",
    ".crdownload",
)
# Files larger than this are fingerprinted by size and mtime instead of read: hashing a few GB of
# weights on every save of model.py would make reloads slow.
_HASH_CONTENT_LIMIT = 64 * 1024 * 1024


def is_ignored_name(name: str) -> bool:
    """True for file or folder names that are never part of a model (caches, editor files).

    Hidden names (`.model.py.swp`, `.#model.py`), `__pycache__`, `*.pyc`, `*~`, Emacs `#x#`,
    vim's write-test file `4913` and temp/partial-download suffixes.
    """
    return (
        name in _IGNORED_DIRS
        or name.startswith(".")
        or name.endswith("~")
        or (name.startswith("#") and name.endswith("#"))
        or name == "4913"
        or name.endswith(_IGNORED_SUFFIXES)
    )


def content_digest(model_dir: Path) -> str:
    """A hash of everything in a model folder that can change what loads: every file's relative
    path and bytes (size and mtime for files over 64 MiB), ignored names skipped.

    Equal digests mean a reload would load the same thing, whatever the file times say. A folder
    that vanishes while being read gives the digest of what was read.
    """
    digest = hashlib.sha256()
    for path in sorted(_content_files(model_dir)):
        relative = path.relative_to(model_dir).as_posix()
        try:
            stat = path.stat()
            if stat.st_size > _HASH_CONTENT_LIMIT:
                data = f"{stat.st_size}:{stat.st_mtime_ns}".encode()
            else:
                data = path.read_bytes()
        except OSError:
            continue  # removed between listing and reading: the next event says what changed
        digest.update(relative.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


def _content_files(model_dir: Path) -> list[Path]:
    files = []
    for root, dirs, names in os.walk(model_dir):
        dirs[:] = [d for d in dirs if not is_ignored_name(d)]
        files += [Path(root, n) for n in names if not is_ignored_name(n)]
    return files
