"""An `EXECUTION_ENV_PATH` archive unpacks only inside its folder, within limits, into a bounded
cache (issue 38, finding 3; model_repository_loader/isolation/archives.py and environments.py).

Real archives made here with tarfile, each holding an environment whose `bin/python3` is a
script that starts this test's Python, plus what an attacker would add; unpacked by `prepare`,
as a model's load does, into a cache in the test's folder.
"""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
import sys
import tarfile
from collections.abc import Iterable
from pathlib import Path

import pytest

from model_repository_loader.config import ConfigOptions
from model_repository_loader.errors import ModelLoadError
from model_repository_loader.inference import InferRequest
from model_repository_loader.isolation.environments import (
    CACHE_ENV,
    EnvironmentLimits,
    content_key,
    prepare,
    release,
)
from model_repository_loader.loader import load_repository

PYTHON = f'#!/bin/sh\nexec "{sys.executable}" "$@"\n'.encode()


def _file(name: str, data: bytes, mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    entry = tarfile.TarInfo(name)
    entry.size, entry.mode = len(data), mode
    return entry, data


def _entry(name: str, kind: bytes, linkname: str = "", mode: int = 0o644) -> tuple:
    entry = tarfile.TarInfo(name)
    entry.type, entry.linkname, entry.mode = kind, linkname, mode
    return entry, b""


def _archive(path: Path, members: Iterable[tuple[tarfile.TarInfo, bytes]]) -> Path:
    """A .tar.gz of a working environment, then `members` in order."""
    with tarfile.open(path, "w:gz") as tar:
        for entry, data in [_file("bin/python3", PYTHON, 0o755), *members]:
            tar.addfile(entry, io.BytesIO(data) if entry.isreg() else None)
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(folder))
    return folder


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside the cache that no archive may change."""
    path = tmp_path / "victim"
    path.write_bytes(b"precious")
    return path


def _refused(archive: Path, limits: EnvironmentLimits = EnvironmentLimits()) -> str:
    with pytest.raises(ModelLoadError) as caught:
        prepare(archive, limits)
    return caught.value.message


def _unpack_refused(archive: Path, reason: str) -> str:
    return f"Internal: failed to unpack the Python environment '{archive}': {reason}"


def _nothing_kept(cache: Path, archive: Path) -> bool:
    """Only the archive's lock file is left in the cache: no unpacked or half-unpacked folder."""
    return sorted(p.name for p in cache.iterdir()) == [f"{content_key(archive)}.lock"]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


# Attacks: each unpacked before the fix.


@pytest.mark.parametrize("absolute", [True, False], ids=["absolute", "dot-dot"])
def test_a_hard_link_out_then_a_file_over_it_changes_nothing_outside(
    tmp_path, cache, victim, absolute
):
    # The hard link names the victim; the file of the same name after it wrote into the
    # victim's inode through it.
    linkname = str(victim) if absolute else "../../victim"
    archive = _archive(
        tmp_path / "env.tar.gz",
        [_entry("x", tarfile.LNKTYPE, linkname), _file("x", b"owned")],
    )
    reason = "Path is absolute" if absolute else "Path contains '..'"
    assert _refused(archive) == _unpack_refused(archive, f"hard link 'x' -> '{linkname}': {reason}")
    assert victim.read_bytes() == b"precious"
    assert _nothing_kept(cache, archive)


def test_a_hard_link_to_a_symbolic_link_is_refused(tmp_path, cache):
    # `deep/s -> ../x` stays inside; the same link as `h` at the top would lead outside.
    archive = _archive(
        tmp_path / "env.tar.gz",
        [_entry("deep/s", tarfile.SYMTYPE, "../x"), _entry("h", tarfile.LNKTYPE, "deep/s")],
    )
    assert _refused(archive) == _unpack_refused(
        archive, "hard link 'h' -> 'deep/s': the target is a symbolic link, not a file"
    )
    assert _nothing_kept(cache, archive)


def test_a_symbolic_link_to_an_absolute_path_is_refused(tmp_path, cache, victim):
    archive = _archive(tmp_path / "env.tar.gz", [_entry("lib/x", tarfile.SYMTYPE, str(victim))])
    assert _refused(archive) == _unpack_refused(
        archive, f"symbolic link 'lib/x' -> '{victim}': Path is absolute"
    )
    assert _nothing_kept(cache, archive)


def test_a_symbolic_link_climbing_out_is_refused(tmp_path, cache):
    archive = _archive(tmp_path / "env.tar.gz", [_entry("lib/up", tarfile.SYMTYPE, "../../victim")])
    assert _refused(archive) == _unpack_refused(
        archive,
        "symbolic link 'lib/up' -> '../../victim' leads outside the environment's folder",
    )
    assert _nothing_kept(cache, archive)


def test_a_symbolic_link_that_climbs_through_another_is_refused(tmp_path, cache):
    # `a -> .` stays inside, and `b -> a/..` reads as inside, but the kernel takes `a/..` as
    # the parent of the unpacked folder.
    archive = _archive(
        tmp_path / "env.tar.gz",
        [_entry("a", tarfile.SYMTYPE, "."), _entry("b", tarfile.SYMTYPE, "a/../victim")],
    )
    assert _refused(archive) == _unpack_refused(
        archive, "symbolic link 'b' -> 'a/../victim': Path contains '..' after a name"
    )
    assert _nothing_kept(cache, archive)


def test_a_fifo_is_refused(tmp_path, cache):
    archive = _archive(tmp_path / "env.tar.gz", [_entry("bin/pipe", tarfile.FIFOTYPE)])
    assert _refused(archive) == _unpack_refused(
        archive, "'bin/pipe' is a FIFO: only folders, files and links are unpacked"
    )
    assert _nothing_kept(cache, archive)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can make a device file")
def test_a_device_file_is_refused(tmp_path, cache):
    device = _entry("dev/mem", tarfile.CHRTYPE)[0]
    device.devmajor, device.devminor = 1, 1  # /dev/mem
    archive = _archive(tmp_path / "env.tar.gz", [(device, b"")])
    assert _refused(archive) == _unpack_refused(
        archive, "'dev/mem' is a character device: only folders, files and links are unpacked"
    )
    assert _nothing_kept(cache, archive)


# Rules Triton's stub has too (these were refused before, now with Triton's texts).


@pytest.mark.parametrize(
    ("name", "reason"),
    [("../../escaped", "Path contains '..'"), ("/tmp/escaped", "Path is absolute")],
)
def test_names_out_of_the_folder_are_refused_with_triton_s_text(tmp_path, cache, name, reason):
    archive = _archive(tmp_path / "env.tar.gz", [_file(name, b"traversal-test\n")])
    assert _refused(archive) == _unpack_refused(archive, f"'{name}': {reason}")
    assert _nothing_kept(cache, archive)


def test_nothing_is_unpacked_through_a_symbolic_link(tmp_path, cache):
    archive = _archive(
        tmp_path / "env.tar.gz",
        [_entry("lib", tarfile.SYMTYPE, "bin"), _file("lib/x", b"through the link")],
    )
    assert _refused(archive) == _unpack_refused(
        archive, "'lib/x': Cannot extract through symlink 'lib'"
    )


def test_modes_lose_setuid_setgid_sticky_and_others_write(tmp_path, cache):
    folder = _entry("share", tarfile.DIRTYPE, mode=0o3777)[0]
    archive = _archive(
        tmp_path / "env.tar.gz",
        [
            _file("bin/tool", b"#!/bin/sh\n", 0o4755),
            _file("bin/group", b"#!/bin/sh\n", 0o2775),
            _file("share/data", b"x", 0o666),
            _file("share/private", b"x", 0o400),
            (folder, b""),
        ],
    )
    environment = prepare(archive)
    try:
        root = environment.root
        assert _mode(root / "bin" / "tool") == 0o755
        assert _mode(root / "bin" / "group") == 0o755
        assert _mode(root / "share" / "data") == 0o644
        assert _mode(root / "share" / "private") == 0o600
        assert _mode(root / "share") == 0o755
    finally:
        release(environment)


def test_a_conda_pack_shaped_archive_unpacks_whole(tmp_path, cache):
    # Relative links inside, a folder link, a hard link to an earlier file, `./` names.
    archive = _archive(
        tmp_path / "env.tar.gz",
        [
            _file("./lib/libz.so.1.3", b"library"),
            _entry("./lib/libz.so", tarfile.SYMTYPE, "libz.so.1.3"),
            _entry("./lib/python3.1", tarfile.SYMTYPE, "python3.11"),
            _file("lib/python3.11/site.py", b"# site"),
            _entry("bin/python3.11", tarfile.LNKTYPE, "bin/python3"),
            _entry("include/zlib", tarfile.SYMTYPE, "../lib/python3.11"),
            _file("x", b"first"),
            _file("x", b"second"),
        ],
    )
    environment = prepare(archive)
    try:
        root = environment.root
        assert (root / "lib" / "libz.so").read_bytes() == b"library"
        assert (root / "include" / "zlib" / "site.py").read_bytes() == b"# site"
        assert (root / "bin" / "python3.11").samefile(root / "bin" / "python3")
        assert (root / "x").read_bytes() == b"second"
    finally:
        release(environment)


def test_conda_unpack_runs_where_the_environment_lives(tmp_path, cache):
    # conda-pack's bin/conda-unpack rewrites the packed prefixes into the folder it runs from:
    # that must be the environment's final place, not a temporary one renamed afterwards.
    script = b"import pathlib, sys\nhere = pathlib.Path(sys.argv[0]).resolve().parent.parent\n"
    script += b"(here / 'prefix.txt').write_text(str(here))\n"
    archive = _archive(tmp_path / "conda.tar.gz", [_file("bin/conda-unpack", script, 0o755)])
    environment = prepare(archive)
    try:
        root = environment.root
        assert (root / "prefix.txt").read_text() == str(root.resolve())
    finally:
        release(environment)


def test_a_failing_conda_unpack_fails_the_load_and_keeps_nothing(tmp_path, cache):
    failing = _file("bin/conda-unpack", b"import sys\nsys.exit('no prefix')\n", 0o755)
    archive = _archive(tmp_path / "broken.tar.gz", [failing])
    assert "bin/conda-unpack failed: no prefix" in _refused(archive)
    assert _nothing_kept(cache, archive)


# Limits.


def test_an_archive_unpacking_past_the_byte_limit_is_refused(tmp_path, cache):
    # 4 MiB of zeros: a few KB packed. Each file is within the limit, all of them are not.
    archive = _archive(
        tmp_path / "env.tar.gz",
        [_file(f"lib/blob{i}", bytes(1 << 20)) for i in range(4)],
    )
    limits = EnvironmentLimits(max_bytes=3 << 20)
    assert archive.stat().st_size < 64 << 10
    assert _refused(archive, limits) == (
        f"Internal: the Python environment '{archive}' unpacks to more than {3 << 20} bytes, "
        "past the limit (--environment-max-bytes)"
    )
    assert _nothing_kept(cache, archive)
    assert prepare(archive, EnvironmentLimits(max_bytes=5 << 20)).root.is_dir()


def test_an_archive_with_more_members_than_the_limit_is_refused(tmp_path, cache):
    archive = _archive(tmp_path / "env.tar.gz", [_file(f"lib/f{i}", b"x") for i in range(5)])
    assert _refused(archive, EnvironmentLimits(max_files=5)) == (
        f"Internal: the Python environment '{archive}' unpacks to more than 5 files, "
        "past the limit (--environment-max-files)"
    )
    assert _nothing_kept(cache, archive)
    release(prepare(archive, EnvironmentLimits(max_files=6)))


# The cache's bound.


def _environment(tmp_path: Path, name: str) -> Path:
    """An archive of ~1 KB of files, its content its own."""
    return _archive(tmp_path / f"{name}.tar.gz", [_file("lib/data", name.encode().ljust(1000))])


def _unpacked(cache: Path, archive: Path) -> bool:
    return (cache / content_key(archive)).is_dir()


def test_unused_environments_are_evicted_least_recently_used_first(tmp_path, cache):
    limits = EnvironmentLimits(cache_bytes=3000)  # two of them, not three
    first, second, third = (_environment(tmp_path, n) for n in ("first", "second", "third"))
    release(prepare(first, limits))
    release(prepare(second, limits))
    assert _unpacked(cache, first) and _unpacked(cache, second)  # within the bound: kept
    os.utime(cache / content_key(first), (1, 1))  # used long ago
    held = prepare(third, limits)
    try:
        assert not _unpacked(cache, first)
        assert _unpacked(cache, second) and _unpacked(cache, third)
    finally:
        release(held)
    assert sorted(p.name for p in cache.iterdir() if ".partial-" in p.name) == []


def test_an_environment_in_use_is_never_evicted(tmp_path, cache):
    limits = EnvironmentLimits(cache_bytes=1)  # every one is past the bound
    first, second = _environment(tmp_path, "first"), _environment(tmp_path, "second")
    one, other = prepare(first, limits), prepare(second, limits)
    assert _unpacked(cache, first) and _unpacked(cache, second)
    release(one)  # the first is unused now: evicted; the second is still in use
    assert not _unpacked(cache, first) and _unpacked(cache, second)
    again = prepare(first, limits)  # unpacked anew
    assert _unpacked(cache, first)
    release(other)
    assert not _unpacked(cache, second) and _unpacked(cache, first)
    release(again)
    assert not _unpacked(cache, first)


def test_an_environment_another_process_uses_is_never_evicted(tmp_path, cache):
    limits = EnvironmentLimits(cache_bytes=1)
    theirs, ours = _environment(tmp_path, "theirs"), _environment(tmp_path, "ours")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\n"
            "from pathlib import Path\n"
            "from model_repository_loader.isolation.environments import prepare\n"
            "prepare(Path(sys.argv[1]))\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n",
            str(theirs),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, CACHE_ENV: str(cache)},
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        release(prepare(ours, limits))  # ours is evicted at once; theirs is in use
        assert _unpacked(cache, theirs) and not _unpacked(cache, ours)
    finally:
        holder.communicate(timeout=60)
    release(prepare(ours, limits))  # nobody uses either now
    assert not _unpacked(cache, theirs) and not _unpacked(cache, ours)


def test_a_failed_check_does_not_keep_the_environment_in_use(tmp_path, cache):
    archive = tmp_path / "env.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:  # no interpreter: the check fails
        entry, data = _file("lib/data", b"x" * 100)
        tar.addfile(entry, io.BytesIO(data))
    with pytest.raises(ModelLoadError, match="has no bin/python3 or bin/python"):
        prepare(archive, EnvironmentLimits(cache_bytes=1))
    release(prepare(_environment(tmp_path, "next"), EnvironmentLimits(cache_bytes=1)))
    assert not _unpacked(cache, archive)


# A model version uses its environment from its load to its unload.

SOURCE = Path(__file__).resolve().parents[1] / "repositories" / "environments" / "server_numpy"


def _model(repository: Path, name: str, archive: Path, model_py: str | None = None) -> None:
    shutil.copytree(SOURCE, repository / name)
    if model_py is not None:
        (repository / name / "1" / "model.py").write_text(model_py)
    with open(repository / name / "config.pbtxt", "a") as config:
        config.write(
            f'parameters {{ key: "EXECUTION_ENV_PATH" value {{ string_value: "{archive}" }} }}\n'
        )


def test_a_loaded_model_holds_its_environment_until_unloaded(tmp_path, cache):
    archive = _environment(tmp_path, "model")
    repository = tmp_path / "models"
    _model(repository, "served", archive)
    options = ConfigOptions(environment_limits=EnvironmentLimits(cache_bytes=1))
    loaded = load_repository([repository], options)
    try:
        assert not loaded.failures, loaded.failures
        answer = loaded.models["served"].infer(InferRequest([]), timeout=60)
        assert not answer.has_error(), answer.error().message()
        assert _unpacked(cache, archive)  # past the bound, but in use
    finally:
        loaded.close()
    assert not _unpacked(cache, archive)


def test_a_model_that_fails_to_load_lets_its_environment_go(tmp_path, cache):
    archive = _environment(tmp_path, "model")
    repository = tmp_path / "models"
    failing = "class TritonPythonModel:\n    def initialize(self, args):\n        1 / 0\n"
    _model(repository, "failing", archive, failing)
    options = ConfigOptions(environment_limits=EnvironmentLimits(cache_bytes=1))
    loaded = load_repository([repository], options)
    try:
        assert set(loaded.failures) == {"failing"}
        assert not _unpacked(cache, archive)
    finally:
        loaded.close()
