"""What a step directory holds, walked safely, and the types a listing is made of.

:func:`walk` lists every regular file under it, from an open descriptor without following
links and within bounds. The types are :class:`Entry`, :class:`Tree`, :class:`StepDir` and
:class:`InFlight`, with the memo a caller may keep between walks (:class:`TreeMemo`). Which
step directories are committed is :mod:`trainguard.shared.steps`'s concern.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import NamedTuple, Protocol

from trainguard.shared.fileio import (
    DIR_FD,
    FILE_FLAGS,
    O_CLOEXEC,
    O_DIRECTORY,
    is_not_a_dir_error,
)
from trainguard.shared.manifest import ManifestError, Record

#: a step directory with more files than this, or nested deeper, is not one we can judge
MAX_STEP_FILES = 100_000
MAX_DEPTH = 32
_DIR_OPEN = os.O_RDONLY | O_DIRECTORY | FILE_FLAGS | O_CLOEXEC


class Entry(NamedTuple):
    """A checkpoint file (or ``.part``) found in a directory, with its lstat.

    For a file under a step directory, its path relative to the location
    (``checkpoint-500/model.safetensors``). (A named tuple: one is built per file per scrape, and
    a frozen dataclass costs several times more.)
    """

    name: str
    step: int
    stat: os.stat_result


class Tree(NamedTuple):
    files: list[tuple[str, os.stat_result]]  # relative to the step directory
    touched_ns: int | None
    top: dict[str, os.stat_result]  # the files directly in the step directory (markers)


class StepDir(NamedTuple):
    """A committed step directory: its files, their newest times, and what committed it.

    It holds every regular file under it, the newest modification time of it, its subdirectories
    and its files (None when any is unknown), and what committed it (``"record"``: a trainguard
    record listing every file; ``"marker"``: the framework's marker).
    """

    name: str
    step: int
    files: tuple[Entry, ...]
    touched_ns: int | None
    commit: str
    record: Record | None
    tree: Tree | None = None  # what it was built from (the memo reuses it while unchanged)


class InFlight(NamedTuple):
    """A step directory not committed (yet).

    It is being written, or was left by a writer that died (an orphan, once it has not been
    touched for long).
    """

    name: str
    step: int
    touched_ns: int | None
    files: int


class TreeMemo(Protocol):
    """What a caller remembers of the directories of step trees between walks.

    The exporter's is ``trainguard.exporter.collectors.checkpoints.dirwatch.StepTreeMemo``. An
    unchanged directory is not listed again: its files are only stat'ed.
    """

    def known(self, rel: str, st: os.stat_result) -> tuple[list[str], list[str]] | None: ...

    def store(self, rel: str, st: os.stat_result, files: list[str], dirs: list[str]) -> None: ...

    def forget(self, rel: str) -> None: ...

    def marker(self, key: tuple[int, ...]) -> bool | None: ...

    def store_marker(self, key: tuple[int, ...], ok: bool) -> None: ...

    def tree(self, rel: str) -> Tree | None:
        """The tree last walked under ``rel``, while its files need not be stat'ed again."""

    def store_tree(self, rel: str, tree: Tree) -> None: ...

    def step_dir(self, name: str) -> StepDir | None: ...

    def store_step_dir(self, step_dir: StepDir) -> None: ...


def open_dir(name: str, dir_fd: int | None, path: Path) -> int:
    """Open a directory (relative to ``dir_fd`` where the platform can), never through a link."""
    if DIR_FD and dir_fd is not None:
        return os.open(name, _DIR_OPEN, dir_fd=dir_fd)
    return os.open(path / name, _DIR_OPEN)


def _lstat(name: str, dfd: int, path: Path) -> os.stat_result:
    if DIR_FD:
        return os.stat(name, dir_fd=dfd, follow_symlinks=False)
    return os.lstat(path / name)


def _unchanged(fd: int, where: Path, key: str, memo: TreeMemo, depth: int) -> bool:
    """Whether every directory of the tree at ``fd`` has the stat the memo trusts."""
    if depth > MAX_DEPTH:
        return False
    known = memo.known(key, os.fstat(fd))
    if known is None:
        return False
    for dname in known[1]:
        try:
            sub = open_dir(dname, fd, where)
        except OSError:
            return False
        try:
            if not _unchanged(sub, where / dname, f"{key}/{dname}", memo, depth + 1):
                return False
        finally:
            os.close(sub)
    return True


def walk(dfd: int, path: Path, rel: str, memo: TreeMemo | None) -> Tree:
    """Every regular file under the open directory ``dfd``, with the newest mtime of the tree.

    ``dfd`` is at ``path``, ``rel`` relative to the location. A symbolic link anywhere under it
    is a ManifestError (links are never followed out of a checkpoint); more than
    :data:`MAX_STEP_FILES` files or deeper than :data:`MAX_DEPTH` too.

    With a ``memo``: a tree whose directories all have the stat it trusts, and whose files were
    stat'ed recently enough (the memo says), is the same :class:`Tree` as last time, without
    an lstat per file.
    """
    if memo is not None:
        cached = memo.tree(rel)
        if cached is not None and _unchanged(dfd, path, rel, memo, 0):
            return cached
    tree = _walk(dfd, path, rel, memo)
    if memo is not None:
        memo.store_tree(rel, tree)
    return tree


def _walk(dfd: int, path: Path, rel: str, memo: TreeMemo | None) -> Tree:
    files: list[tuple[str, os.stat_result]] = []
    newest = 0
    unknown = False

    def visit(fd: int, where: Path, sub: str, depth: int) -> None:
        nonlocal newest, unknown
        if depth > MAX_DEPTH:
            raise ManifestError(f"{where}: nested deeper than {MAX_DEPTH} directories")
        st_dir = os.fstat(fd)
        mt = st_dir.st_mtime_ns
        if mt <= 0:
            unknown = True
        elif mt > newest:
            newest = mt
        key = f"{rel}/{sub}" if sub else rel
        known = memo.known(key, st_dir) if memo is not None else None
        here: list[tuple[str, os.stat_result]] = []
        dnames: list[str]
        if known is not None:
            fnames, dnames = known
            try:
                for fname in fnames:
                    st = _lstat(fname, fd, where)
                    if not stat.S_ISREG(st.st_mode):
                        raise FileNotFoundError(fname)  # changed kind: list the directory
                    here.append((fname, st))
            except FileNotFoundError:
                known = None
                here = []
        if known is None:
            fnames, dnames = [], []
            with os.scandir(fd if DIR_FD else where) as it:
                for entry in it:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if stat.S_ISLNK(st.st_mode):
                        raise ManifestError(
                            f"{where / entry.name} is a symbolic link; links are not followed"
                        )
                    if stat.S_ISREG(st.st_mode):
                        fnames.append(entry.name)
                        here.append((entry.name, st))
                    elif stat.S_ISDIR(st.st_mode):
                        dnames.append(entry.name)
            if memo is not None:
                memo.store(key, st_dir, fnames, dnames)
        for fname, st in here:
            if len(files) >= MAX_STEP_FILES:
                raise ManifestError(f"{path}: more than {MAX_STEP_FILES} files")
            fm = st.st_mtime_ns
            if fm <= 0:
                unknown = True
            elif fm > newest:
                newest = fm
            files.append((f"{sub}/{fname}" if sub else fname, st))
        for dname in dnames:
            try:
                sub_fd = open_dir(dname, fd, where)
            except FileNotFoundError:
                if memo is not None:
                    memo.forget(key)
                continue
            except OSError as exc:
                if is_not_a_dir_error(exc):  # a link, not a dir
                    raise ManifestError(
                        f"{where / dname} is not a directory any more (a link?)"
                    ) from None
                raise
            try:
                visit(sub_fd, where / dname, f"{sub}/{dname}" if sub else dname, depth + 1)
            finally:
                os.close(sub_fd)

    visit(dfd, path, "", 0)
    top = {name: st for name, st in files if "/" not in name}
    return Tree(files, None if unknown else newest, top)
