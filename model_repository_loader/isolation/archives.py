"""Unpacking an environment's archive (`EXECUTION_ENV_PATH`) so that nothing lands outside it.

Triton's stub unpacks with libarchive, refusing `..` in a path, absolute paths and writes
through a symlink (ARCHIVE_EXTRACT_SECURE_NODOTDOT, _NOABSOLUTEPATHS, _SYMLINKS [S: pb_env.cc]),
and without ARCHIVE_EXTRACT_PERM, so setuid, setgid and sticky bits are dropped. This is as
strict, and stricter (issue 38, finding 3), with its own checks rather than tarfile's filters:
the interpreters this package runs on (3.11.7 here) predate the 2025 fixes to `filter="data"`,
whose checks resolve paths on disk and could be led outside.

Nothing here resolves a path on disk. What has been unpacked so far is kept as a tree (each
name: a folder, a file or a symbolic link) and every member is judged against it:

* a name is relative and has no `..` (Triton's texts: "Path is absolute", "Path contains '..'");
  `.` and empty parts are dropped, so `./bin/python` is `bin/python`;
* a member is a folder, a regular file, a symbolic link or a hard link; a device, a FIFO or
  anything else is refused;
* no member lies below a symbolic link or a file ("Cannot extract through symlink", libarchive's
  text), and a folder is never replaced by anything else: every folder on a member's path is one
  this unpack made, so the kernel resolves it as the tree does;
* a symbolic link's target is relative, and is some `..` first, then names only: it climbs at
  most to the top of the unpacked folder (counted from the link's own folder, which is real) and
  then goes down, where every name is a folder or a link checked the same way. So it cannot lead
  out now, nor after later members (`a -> .` then `b -> a/..` is refused);
* a hard link names a regular file unpacked before it (not a link: a hard link to a symbolic
  link is a copy of it, resolved from another folder);
* a member that replaces a file or a link removes it first and is then made anew (`O_EXCL`,
  `O_NOFOLLOW`): nothing is written through a link, nor into the file another member shares by
  a hard link;
* modes as `filter="data"` sets them: high bits and group and other write dropped; a file is
  readable and writable by its owner, executable only if its owner may run it; a folder keeps
  its owner's access. Owners are never set (everything belongs to the server's user);
* at most `max_files` members and `max_bytes` bytes: a file's bytes are counted as they are
  written (the archive's declared sizes are only checked first), and the unpack stops at the
  limit (`TooLarge`).
"""

from __future__ import annotations

import enum
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

_CHUNK = 1 << 20

Name = tuple[str, ...]


class Refused(Exception):
    """A member the unpack refuses; the text says which and why."""


class TooLarge(Exception):
    """The archive unpacks to more than a limit allows."""

    def __init__(self, what: str, limit: int) -> None:
        super().__init__(f"more than {limit} {what}")
        self.what = what
        self.limit = limit


class _Kind(enum.Enum):
    FOLDER = "folder"
    FILE = "file"
    LINK = "symbolic link"


@dataclass
class _Tree:
    """What has been unpacked so far, by name (the top folder is the empty name)."""

    kinds: dict[Name, _Kind] = field(default_factory=lambda: {(): _Kind.FOLDER})
    # Folder → (mode, mtime) to set once everything is unpacked (a read-only folder would
    # refuse its members otherwise).
    folders: dict[Name, tuple[int, float | None]] = field(default_factory=dict)


@dataclass
class _Budget:
    max_bytes: int
    max_files: int
    bytes: int = 0
    files: int = 0

    def member(self) -> None:
        self.files += 1
        if self.files > self.max_files:
            raise TooLarge("files", self.max_files)

    def declared(self, size: int) -> None:
        if self.bytes + size > self.max_bytes:
            raise TooLarge("bytes", self.max_bytes)

    def written(self, size: int) -> None:
        self.bytes += size
        if self.bytes > self.max_bytes:
            raise TooLarge("bytes", self.max_bytes)


def unpack(archive: Path, folder: Path, max_bytes: int, max_files: int) -> int:
    """Unpack `archive` into the empty `folder`; the bytes written. Raises Refused, TooLarge,
    tarfile.TarError or OSError (a corrupt archive, a full disk), leaving what was written."""
    tree = _Tree()
    budget = _Budget(max_bytes, max_files)
    with tarfile.open(archive) as tar:
        for member in tar:
            name = _name(member.name)
            if name == ():
                continue  # `.`: the folder itself, ours already
            budget.member()
            _unpack_member(tar, member, name, folder, tree, budget)
    _finish_folders(folder, tree)
    return budget.bytes


def _unpack_member(
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    name: Name,
    folder: Path,
    tree: _Tree,
    budget: _Budget,
) -> None:
    _make_parents(name, folder, tree)
    path = folder.joinpath(*name)
    if member.isdir():
        _make_folder(name, path, tree)
        tree.folders[name] = (_folder_mode(member.mode), member.mtime)
        return
    if not (member.isreg() or member.issym() or member.islnk()):
        raise Refused(
            f"'{member.name}' is {_what(member)}: only folders, files and links are unpacked"
        )
    _make_room(name, path, tree)
    if member.isreg():
        budget.declared(member.size)
        _write_file(tar, member, path, budget)
        tree.kinds[name] = _Kind.FILE
    elif member.issym():
        _check_symlink(name, member)
        os.symlink(member.linkname, path)
        tree.kinds[name] = _Kind.LINK
    else:
        source = _hard_link_source(member, tree)
        os.link(folder.joinpath(*source), path, follow_symlinks=False)
        tree.kinds[name] = _Kind.FILE


def _name(text: str, shown: str = "") -> Name:
    """A path in the archive as parts below the folder; Refused (the text starting with
    `shown`, else the path) when absolute or with `..`."""
    shown = shown or f"'{text}'"
    if text.startswith("/"):
        raise Refused(f"{shown}: Path is absolute")
    parts = tuple(part for part in text.split("/") if part not in ("", "."))
    if ".." in parts:
        raise Refused(f"{shown}: Path contains '..'")
    return parts


def _what(member: tarfile.TarInfo) -> str:
    if member.ischr():
        return "a character device"
    if member.isblk():
        return "a block device"
    if member.isfifo():
        return "a FIFO"
    return f"of type {member.type!r}"


def _make_parents(name: Name, folder: Path, tree: _Tree) -> None:
    """Every folder above `name`, made (0700 until the end) where missing; Refused when one of
    them is a link or a file: the member would land wherever that leads."""
    for depth in range(1, len(name)):
        parent = name[:depth]
        kind = tree.kinds.get(parent)
        if kind is _Kind.FOLDER:
            continue
        shown = "/".join(name)
        if kind is _Kind.LINK:
            raise Refused(f"'{shown}': Cannot extract through symlink '{'/'.join(parent)}'")
        if kind is _Kind.FILE:
            raise Refused(f"'{shown}': '{'/'.join(parent)}' is a file, not a folder")
        os.mkdir(folder.joinpath(*parent), 0o700)
        tree.kinds[parent] = _Kind.FOLDER


def _make_folder(name: Name, path: Path, tree: _Tree) -> None:
    kind = tree.kinds.get(name)
    if kind is _Kind.FOLDER:
        return  # named twice: the last mode wins, as in tar
    if kind is not None:
        os.unlink(path)  # a file or a link gives way to the folder
        del tree.kinds[name]
    os.mkdir(path, 0o700)
    tree.kinds[name] = _Kind.FOLDER


def _make_room(name: Name, path: Path, tree: _Tree) -> None:
    """Remove what an earlier member left at `name`, so that nothing is written through it."""
    kind = tree.kinds.get(name)
    if kind is None:
        return
    if kind is _Kind.FOLDER:
        raise Refused(f"'{'/'.join(name)}' would replace a folder")
    os.unlink(path)
    del tree.kinds[name]


def _write_file(tar: tarfile.TarFile, member: tarfile.TarInfo, path: Path, budget: _Budget) -> None:
    source = tar.extractfile(member)
    assert source is not None  # a regular member always has contents
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with open(fd, "wb") as out:
        _copy(source, out, budget)
        os.fchmod(fd, _file_mode(member.mode))
        _set_mtime(fd, member.mtime)


def _copy(source: IO[bytes], out: IO[bytes], budget: _Budget) -> None:
    while chunk := source.read(_CHUNK):
        budget.written(len(chunk))  # before writing: the limit is never passed on disk
        out.write(chunk)


def _check_symlink(name: Name, member: tarfile.TarInfo) -> None:
    """Refused unless the link `name` stays inside the folder whatever it meets on its way, now
    or after later members. Its own folder is real (no member lies below a link), so climbing
    `ups` folders from there, no more than its depth, ends inside; each name below is then a
    folder of this unpack, a file, or a link held to the same rule."""
    shown = f"symbolic link '{'/'.join(name)}' -> '{member.linkname}'"
    if member.linkname.startswith("/"):
        raise Refused(f"{shown}: Path is absolute")
    parts = [part for part in member.linkname.split("/") if part not in ("", ".")]
    ups = 0
    while ups < len(parts) and parts[ups] == "..":
        ups += 1
    if ".." in parts[ups:]:
        raise Refused(f"{shown}: Path contains '..' after a name")
    here = name[:-1]
    if ups > len(here):
        raise Refused(f"{shown} leads outside the environment's folder")


def _hard_link_source(member: tarfile.TarInfo, tree: _Tree) -> Name:
    """The earlier regular file a hard link names (a path in the archive, as tar writes it)."""
    shown = f"hard link '{member.name}' -> '{member.linkname}'"
    source = _name(member.linkname, shown)
    kind = tree.kinds.get(source)
    if kind is _Kind.FILE:
        return source
    if kind is None:
        raise Refused(f"{shown}: no file of that name was unpacked before it")
    raise Refused(f"{shown}: the target is a {kind.value}, not a file")


def _file_mode(mode: int) -> int:
    """As `filter="data"`: no high bits, no group or other write; the owner reads and writes,
    and nobody executes what its owner may not."""
    mode &= 0o755
    if not mode & 0o100:
        mode &= ~0o111
    return mode | 0o600


def _folder_mode(mode: int) -> int:
    """No high bits, no group or other write; the owner may always list, enter and change it
    (the cache's eviction removes it)."""
    return (mode & 0o755) | 0o700


def _set_mtime(target: int | Path, mtime: float | None) -> None:
    """Keep the archive's times: a packed `.pyc` is checked against its source's mtime."""
    if mtime is None:
        return
    try:
        os.utime(target, (mtime, mtime))
    except (OSError, OverflowError, ValueError):
        pass  # a time the file system cannot hold: the unpack's own time stays


def _finish_folders(folder: Path, tree: _Tree) -> None:
    """Each folder's own mode and time, deepest first: a folder's time changes as its members
    are made, and a read-only one would have refused them."""
    for name in sorted(tree.folders, key=len, reverse=True):
        mode, mtime = tree.folders[name]
        path = folder.joinpath(*name)
        os.chmod(path, mode)
        _set_mtime(path, mtime)
