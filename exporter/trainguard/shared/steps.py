"""Checkpoints as the frameworks write them: a directory per step (``checkpoint-500/``,
``step-500/``, ``global_step500/``, ``iter_0000500/``), often one file per rank, committed by the
framework's own protocol. This module says which step directories are committed (their *layout*:
which marker the framework writes last), and what each holds (every regular file under it,
walked without following links and within bounds). The library (``latest``/``prune``) and the
exporter share it, so that they never disagree on what is complete."""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple, Protocol

from trainguard.shared.fileio import DIR_FD, FILE_FLAGS, O_CLOEXEC, O_DIRECTORY, O_NONBLOCK
from trainguard.shared.manifest import ManifestError, Record
from trainguard.shared.pattern import CheckpointPattern
from trainguard.shared.selfcheck import indented_json_closed

#: how a location's step directories are committed; ``auto`` picks one from what is there
LAYOUTS = (
    "auto",
    "files",  # single files only (step directories are ignored)
    "trainguard",  # committed by a trainguard.checkpoint record only
    "dcp",  # torch.distributed.checkpoint: `.metadata`, written last (atomic rename)
    "huggingface",  # Hugging Face Trainer: `trainer_state.json`, written last
    "deepspeed",  # steps up to the one named in `latest`, beside the step directories
    "megatron",  # steps up to the one in `latest_checkpointed_iteration.txt`
    "orbax",  # the final name (renamed from `.orbax-checkpoint-tmp-*`) or `commit_success.txt`
)
DEFAULT_LAYOUT = "auto"
DEEPSPEED_LATEST = "latest"
MEGATRON_LATEST = "latest_checkpointed_iteration.txt"
#: files beside the step directories that name the newest committed one
TRACKERS = {DEEPSPEED_LATEST: "deepspeed", MEGATRON_LATEST: "megatron"}
DCP_MARKER = ".metadata"
HF_MARKER = "trainer_state.json"
ORBAX_MARKERS = ("commit_success.txt", "_CHECKPOINT_METADATA")
#: a step directory with more files than this, or nested deeper, is not one we can judge
MAX_STEP_FILES = 100_000
MAX_DEPTH = 32
#: tracker files are a line of text; trainer_state.json grows with the log history
MAX_TRACKER_BYTES = 4096
MAX_HF_STATE_BYTES = 32 * 1024 * 1024
_DIR_OPEN = os.O_RDONLY | O_DIRECTORY | FILE_FLAGS | O_CLOEXEC


class LayoutError(ManifestError):
    """A location whose layout cannot be told (ambiguous markers, a tracker file naming
    something that is not a step): it fails visibly rather than guessing."""


def layout_problem(layout: str) -> str | None:
    """Why ``layout`` is not a layout name, or None."""
    if layout not in LAYOUTS:
        return f"expected one of {', '.join(LAYOUTS)}, got {layout!r}"
    return None


class Entry(NamedTuple):
    """A checkpoint file (or ``.part``) found in a directory, with its lstat; for a file under a
    step directory, its path relative to the location (``checkpoint-500/model.safetensors``).
    (A named tuple: one is built per file per scrape, and a frozen dataclass costs several
    times more.)"""

    name: str
    step: int
    stat: os.stat_result


class Tree(NamedTuple):
    files: list[tuple[str, os.stat_result]]  # relative to the step directory
    touched_ns: int | None
    top: dict[str, os.stat_result]  # the files directly in the step directory (markers)


class StepDir(NamedTuple):
    """A committed step directory: every regular file under it, the newest modification time
    of it, its subdirectories and its files (None when any is unknown), and what committed it
    (``"record"``: a trainguard record listing every file; ``"marker"``: the framework's
    marker)."""

    name: str
    step: int
    files: tuple[Entry, ...]
    touched_ns: int | None
    commit: str
    record: Record | None
    tree: Tree | None = None  # what it was built from (the memo reuses it while unchanged)


class InFlight(NamedTuple):
    """A step directory not committed (yet): being written, or left by a writer that died (an
    orphan, once it has not been touched for long)."""

    name: str
    step: int
    touched_ns: int | None
    files: int


class TreeMemo(Protocol):
    """What a caller remembers of the directories of step trees between walks (the exporter:
    see ``trainguard.exporter.dirwatch.StepTreeMemo``), so an unchanged directory is not listed
    again: its files are only stat'ed."""

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


def _open_dir(name: str, dir_fd: int | None, path: Path) -> int:
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
            sub = _open_dir(dname, fd, where)
        except OSError:
            return False
        try:
            if not _unchanged(sub, where / dname, f"{key}/{dname}", memo, depth + 1):
                return False
        finally:
            os.close(sub)
    return True


def walk(dfd: int, path: Path, rel: str, memo: TreeMemo | None) -> Tree:
    """Every regular file under the open directory ``dfd`` (at ``path``, ``rel`` relative to the
    location), with the newest mtime of the tree. A symbolic link anywhere under it is a
    ManifestError (links are never followed out of a checkpoint); more than
    :data:`MAX_STEP_FILES` files or deeper than :data:`MAX_DEPTH` too.

    With a ``memo``: a tree whose directories all have the stat it trusts, and whose files were
    stat'ed recently enough (the memo says), is the same :class:`Tree` as last time, without
    an lstat per file."""
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
                sub_fd = _open_dir(dname, fd, where)
            except FileNotFoundError:
                if memo is not None:
                    memo.forget(key)
                continue
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.EMLINK, errno.ENOTDIR):  # a link, not a dir
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


def read_small(name: str, dir_fd: int | None, directory: Path, cap: int) -> bytes | None:
    """A small regular file's content (at most ``cap`` bytes, None when larger), never through
    a link nor blocking on a FIFO."""
    flags = os.O_RDONLY | FILE_FLAGS | O_NONBLOCK
    fd = (
        os.open(name, flags, dir_fd=dir_fd)
        if DIR_FD and dir_fd is not None
        else os.open(directory / name, flags)
    )
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ManifestError(f"{directory / name} is not a regular file")
        if st.st_size > cap:
            return None
        chunks: list[bytes] = []
        left = cap + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        return None if len(data) > cap else data
    finally:
        os.close(fd)


def tracker_step(
    layout: str, dir_fd: int | None, directory: Path, pattern: CheckpointPattern
) -> int | None:
    """The newest committed step named by the DeepSpeed ``latest`` or Megatron
    ``latest_checkpointed_iteration.txt`` file beside the step directories; None when there is
    none yet (or Megatron's ``release``). A tracker naming something that is not a step is a
    LayoutError."""
    name = DEEPSPEED_LATEST if layout == "deepspeed" else MEGATRON_LATEST
    try:
        data = read_small(name, dir_fd, directory, MAX_TRACKER_BYTES)
    except FileNotFoundError:
        return None
    if data is None:
        raise LayoutError(f"{directory / name} is larger than {MAX_TRACKER_BYTES} bytes")
    text = data.decode("utf-8", "replace").strip()
    if not text:
        return None  # being written (neither framework writes it atomically)
    if layout == "megatron":
        if text == "release":
            return None
        if text.isascii() and text.isdigit() and len(text) <= 18:
            return int(text)
    else:
        step = pattern.dir_step(text)
        if step is not None:
            return step
    raise LayoutError(
        f"{directory / name} names {text[:80]!r}, which is not a step directory of the pattern "
        f"{pattern.pattern!r}"
    )


def _hf_state_ok(dfd: int, where: Path, st: os.stat_result, memo: TreeMemo | None) -> bool:
    """trainer_state.json is written with a plain open/write, so a save killed while writing it
    leaves a partial document: it marks the step only once it is whole (as the Trainer writes
    it, indented, its last line the top-level ``}``: two small reads; else once it parses)."""
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if memo is not None:
        cached = memo.marker(key)
        if cached is not None:
            return cached
    try:
        ok = _hf_state_closed(dfd, where)
        if not ok:  # not as the Trainer writes it (indented): parse it
            data = read_small(HF_MARKER, dfd, where, MAX_HF_STATE_BYTES)
            ok = data is None or isinstance(json.loads(data), dict)  # too large: present
    except (OSError, ValueError, ManifestError):
        ok = False
    if memo is not None:
        memo.store_marker(key, ok)
    return ok


def _hf_state_closed(dfd: int, where: Path) -> bool:
    """trainer_state.json as the Trainer writes it, whole, by two small reads (selfcheck)."""
    flags = os.O_RDONLY | FILE_FLAGS | O_NONBLOCK
    fd = os.open(HF_MARKER, flags, dir_fd=dfd) if DIR_FD else os.open(where / HF_MARKER, flags)
    try:
        st = os.fstat(fd)
        return stat.S_ISREG(st.st_mode) and indented_json_closed(fd, st.st_size)
    finally:
        os.close(fd)


def _kinds(top: Mapping[str, os.stat_result], temp: bool) -> set[str]:
    """The layouts a step directory's own files (not its subdirectories') point to."""
    kinds = set()
    if HF_MARKER in top:
        kinds.add("huggingface")
    elif DCP_MARKER in top:  # an FSDP Trainer checkpoint holds DCP files as well
        kinds.add("dcp")
    if temp or any(m in top for m in ORBAX_MARKERS):
        kinds.add("orbax")
    return kinds


class _Seen(NamedTuple):
    name: str
    step: int
    temp: bool
    tree: Tree
    top: dict[str, os.stat_result]
    hf_ok: bool


def step_directories(
    directory: Path,
    dir_fd: int | None,
    pattern: CheckpointPattern,
    layout: str,
    records: Mapping[str, Record],
    candidates: list[tuple[str, int, bool]],
    trackers: set[str],
    memo: TreeMemo | None = None,
    fallback: str | None = None,
) -> tuple[tuple[StepDir, ...], tuple[InFlight, ...], str]:
    """The committed and in-flight step directories of a location: ``candidates`` are the
    (name, step, temporary name) of its directories that the pattern matched, ``trackers`` the
    tracker files beside them. Returns them with the layout they were judged by (``auto``
    resolved: ``fallback`` when nothing here tells, which for a mirror is its primary's
    layout, else ``none``, so that only trainguard records commit)."""
    seen: list[_Seen] = []
    for name, step, temp in candidates:
        try:
            dfd = _open_dir(name, dir_fd, directory)
        except FileNotFoundError:
            continue  # renamed (committed) or pruned since the listing
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK, errno.ENOTDIR):
                raise ManifestError(f"{directory / name} is a symbolic link") from None
            raise
        try:
            tree = walk(dfd, directory / name, name, memo)
            top = tree.top
            hf_ok = HF_MARKER in top and _hf_state_ok(dfd, directory / name, top[HF_MARKER], memo)
        finally:
            os.close(dfd)
        seen.append(_Seen(name, step, temp, tree, top, hf_ok))
    resolved = layout
    if layout == "auto":
        resolved = _detect(directory, seen, trackers)
        if resolved == "none" and fallback is not None:
            resolved = fallback
    latest = (
        tracker_step(resolved, dir_fd, directory, pattern)
        if resolved in ("deepspeed", "megatron")
        else None
    )
    committed: list[StepDir] = []
    inflight: list[InFlight] = []
    for s in seen:
        rec = records.get(s.name)
        if rec is not None and rec.files is None:
            raise ManifestError(f"record for {directory / s.name} names a non-regular file")
        commit = None
        if s.temp:
            commit = None
        elif rec is not None:
            commit = "record"
        elif _marked(resolved, s, latest):
            commit = "marker"
        if commit is None:
            inflight.append(InFlight(s.name, s.step, s.tree.touched_ns, len(s.tree.files)))
            continue
        old = memo.step_dir(s.name) if memo is not None else None
        if old is not None and old.tree is s.tree and old.commit == commit and old.record is rec:
            committed.append(old)  # the same object: compared by identity, judged as before
            continue
        files = tuple(Entry(f"{s.name}/{rel}", s.step, st) for rel, st in s.tree.files)
        made = StepDir(s.name, s.step, files, s.tree.touched_ns, commit, rec, s.tree)
        if memo is not None:
            memo.store_step_dir(made)
        committed.append(made)
    return tuple(committed), tuple(inflight), resolved


def _marked(layout: str, s: _Seen, latest: int | None) -> bool:
    if layout == "huggingface":
        return s.hf_ok
    if layout == "dcp":
        return DCP_MARKER in s.top
    if layout in ("deepspeed", "megatron"):
        return latest is not None and s.step <= latest
    # orbax: its final name (Orbax renames the temporary directory to commit); trainguard and
    # none: a record only
    return layout == "orbax"


def _detect(directory: Path, seen: list[_Seen], trackers: set[str]) -> str:
    """The layout a location's contents show, where they show only one."""
    found = {TRACKERS[t] for t in trackers}
    if len(found) > 1:
        raise LayoutError(
            f"{directory}: holds both {DEEPSPEED_LATEST!r} and {MEGATRON_LATEST!r}; set the "
            "location's layout in the config"
        )
    if found:
        return found.pop()
    kinds: set[str] = set()
    for s in seen:
        kinds |= _kinds(s.top, s.temp and ".orbax-checkpoint-tmp" in s.name)
    if len(kinds) > 1:
        raise LayoutError(
            f"{directory}: step directories look like {' and '.join(sorted(kinds))}; set the "
            "location's layout in the config (layout: one of "
            f"{', '.join(LAYOUTS[1:])})"
        )
    return kinds.pop() if kinds else "none"
