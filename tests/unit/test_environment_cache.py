"""The per-model environment cache trusts no other user (issue 38, finding 2;
model_repository_loader/isolation/environments.py): what it holds runs as the server's user.

Real folders, real archives, a real interpreter: the environment's `bin/python3` is a script
that starts this test's Python (a regular file, as conda-pack's archives hold). Another user's
folder is made with os.chown to uid 65534 (nobody), so these tests need root.
"""

from __future__ import annotations

import io
import os
import shutil
import stat
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from model_repository_loader.errors import ModelLoadError
from model_repository_loader.isolation.environments import (
    CACHE_ENV,
    content_key,
    loader_path,
    prepare,
    private_folder,
)

NOBODY = 65534

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def _archive(folder: Path) -> Path:
    """A .tar.gz of an environment whose interpreter is this test's Python."""
    script = f'#!/bin/sh\nexec "{sys.executable}" "$@"\n'.encode()
    archive = folder / "env.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        entry = tarfile.TarInfo("bin/python3")
        entry.size, entry.mode = len(script), 0o755
        tar.addfile(entry, io.BytesIO(script))
    return archive


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    return _archive(tmp_path)


def _use_cache(monkeypatch: pytest.MonkeyPatch, cache: Path) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(cache))
    return cache


def _refused(archive: Path) -> str:
    with pytest.raises(ModelLoadError) as caught:
        prepare(archive)
    return caught.value.message


def test_the_cache_is_made_0700_by_the_server_s_user_and_used(tmp_path, monkeypatch, archive):
    cache = _use_cache(monkeypatch, tmp_path / "made" / "here" / "cache")
    environment = prepare(archive)
    assert environment.root == cache / content_key(archive)
    for folder in (tmp_path / "made", tmp_path / "made" / "here", cache):
        assert _mode(folder) == 0o700
        assert folder.lstat().st_uid == os.geteuid()
    assert _mode(cache / f"{content_key(archive)}.lock") == 0o600


@needs_root
def test_a_cache_folder_of_another_user_is_refused_and_nothing_in_it_runs(
    tmp_path, monkeypatch, archive
):
    # What user nobody could do with a cache folder it made first: an "unpacked" environment
    # whose interpreter leaves a mark when it runs.
    cache = _use_cache(monkeypatch, tmp_path / "cache")
    planted = cache / content_key(archive) / "bin"
    planted.mkdir(parents=True)
    ran = tmp_path / "ran"
    (planted / "python3").write_text(f'#!/bin/sh\ntouch {ran}\nexec {sys.executable} "$@"\n')
    (planted / "python3").chmod(0o755)
    for path in (cache, planted.parent, planted, planted / "python3"):
        os.chown(path, NOBODY, NOBODY)
    message = _refused(archive)
    assert message == (
        f"Internal: '{cache}' is not a private folder of this user: '{cache}' is owned by uid "
        f"{NOBODY}, not by this user ({os.geteuid()}); fix or remove it"
    )
    assert not ran.exists()


@needs_root
def test_a_folder_of_another_user_above_the_cache_is_refused(tmp_path, monkeypatch, archive):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    cache = _use_cache(monkeypatch, theirs / "cache")  # made by us, inside their folder
    assert _refused(archive) == (
        f"Internal: '{cache}' is not a private folder of this user: '{theirs}' is owned by uid "
        f"{NOBODY}, neither this user ({os.geteuid()}) nor root; fix or remove it"
    )
    assert not cache.exists()  # nothing made inside it


@needs_root
def test_a_symlink_to_another_user_s_folder_is_refused(tmp_path, monkeypatch, archive):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    link = tmp_path / "link"
    link.symlink_to(theirs)
    _use_cache(monkeypatch, link)
    assert f"'{theirs}' is owned by uid {NOBODY}" in _refused(archive)


@needs_root
def test_a_symlink_of_another_user_on_the_way_is_refused_wherever_it_points(
    tmp_path, monkeypatch, archive
):
    # In a sticky folder such as /tmp its owner may replace it at any time: even pointing at a
    # folder of ours now, it is not to be followed.
    ours = tmp_path / "ours"
    ours.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(ours)
    os.lchown(link, NOBODY, NOBODY)
    cache = _use_cache(monkeypatch, link / "cache")
    assert _refused(archive) == (
        f"Internal: '{cache}' is not a private folder of this user: '{link}' (a symbolic link) "
        f"is owned by uid {NOBODY}, neither this user ({os.geteuid()}) nor root; fix or remove it"
    )
    assert not (ours / "cache").exists()


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777, 0o720])
def test_a_cache_writable_by_others_is_refused(tmp_path, monkeypatch, archive, mode):
    cache = _use_cache(monkeypatch, tmp_path / "cache")
    cache.mkdir()
    cache.chmod(mode)  # sticky or not: others could add `<sha>` folders of their own
    assert _refused(archive) == (
        f"Internal: '{cache}' is not a private folder of this user: '{cache}' is writable by "
        f"other users (mode {stat.filemode(cache.lstat().st_mode)}); fix or remove it"
    )


def test_a_folder_above_writable_by_others_is_refused_unless_sticky(tmp_path, monkeypatch, archive):
    above = tmp_path / "shared"
    above.mkdir()
    above.chmod(0o777)  # anyone may rename our cache away and put theirs in its place
    cache = _use_cache(monkeypatch, above / "cache")
    assert f"'{above}' is writable by other users" in _refused(archive)
    above.chmod(0o1777)  # as /tmp: others may add entries, not rename or remove ours
    assert prepare(archive).root == cache / content_key(archive)


def test_a_symlinked_lock_is_not_followed(tmp_path, monkeypatch, archive):
    cache = _use_cache(monkeypatch, tmp_path / "cache")
    cache.mkdir(mode=0o700)
    outside = tmp_path / "outside"
    outside.write_bytes(b"must stay as it is")
    lock = cache / f"{content_key(archive)}.lock"
    lock.symlink_to(outside)
    message = _refused(archive)
    assert message.startswith(f"Internal: cannot open the lock '{lock}' of the environment cache")
    assert outside.read_bytes() == b"must stay as it is"
    assert not (cache / content_key(archive)).exists()


def test_private_folder_returns_the_real_path(tmp_path):
    real = tmp_path / "real"
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    assert private_folder(link / "cache") == real / "cache"
    assert _mode(real) == _mode(real / "cache") == 0o700


@needs_root
def test_loader_path_refuses_a_folder_another_user_made_first(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    made = loader_path()  # ours: made, and the same one from then on
    assert made.parent == tmp_path and loader_path() == made
    os.chown(made, NOBODY, NOBODY)
    with pytest.raises(ModelLoadError, match=f"'{made}' is owned by uid {NOBODY}"):
        loader_path()
    # Nor theirs as a link to a folder of root's (where we would then write our link).
    shutil.rmtree(made)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    made.symlink_to(elsewhere)
    os.lchown(made, NOBODY, NOBODY)
    with pytest.raises(ModelLoadError, match="a symbolic link"):
        loader_path()
    assert not list(elsewhere.iterdir())
