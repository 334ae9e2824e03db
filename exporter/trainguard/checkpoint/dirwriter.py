"""``save_dir`` and directory ``mirror``: a step directory with the same guarantees as a single
file (:func:`trainguard.checkpoint.save`): written under ``<name>.part/``, every file and
directory fsynced, committed by renaming the directory, the parent fsynced, and only then one
record listing every file with its size and SHA-256. Several ranks may fill one directory: each
writes its own files, and one record is committed once every rank's files are in."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from trainguard.checkpoint.copier import _copy
from trainguard.checkpoint.part import CheckpointError, lock
from trainguard.shared.fileio import (
    FILE_FLAGS,
    O_CLOEXEC,
    O_DIRECTORY,
    fsync_dir,
    sha256_fd,
    write_all,
)
from trainguard.shared.listing import read_listing
from trainguard.shared.manifest import Record, remove_record, write_record
from trainguard.shared.pattern import DEFAULT_CHECKPOINT_PATTERN, PARTIAL_SUFFIX, CheckpointPattern
from trainguard.shared.steps import DEFAULT_LAYOUT, walk

#: each rank's share of the hashes, inside the ``.part`` directory until the commit
_SHARE = ".trainguard-rank-"
_DIR_FLAGS = os.O_RDONLY | O_DIRECTORY | FILE_FLAGS | O_CLOEXEC

Files = list[tuple[str, int, str | None]]


def _dir_step(path: Path, pattern: str) -> int:
    step = CheckpointPattern(pattern).dir_step(path.name)
    if step is None:
        raise ValueError(
            f"{path.name!r} is not a step directory name of the pattern {pattern!r} (the pattern "
            "exactly, e.g. 'checkpoint-{step}' -> checkpoint-500): the exporter would not see it"
        )
    return step


def _tree(path: Path) -> list[tuple[str, os.stat_result]]:
    """Every regular file under ``path`` (relative paths, sorted), trainguard's own share files
    left out."""
    fd = os.open(path, _DIR_FLAGS)
    try:
        files = walk(fd, path, path.name, None).files
    finally:
        os.close(fd)
    return sorted((rel, st) for rel, st in files if not rel.startswith(_SHARE))


def _subdirs(path: Path) -> list[Path]:
    """``path`` and every directory under it, deepest first (the order to fsync them)."""
    out = [Path(root) for root, _dirs, _files in os.walk(path)]
    return sorted(out, key=lambda p: len(p.parts), reverse=True)


def _fsync_and_hash(path: Path, rel: str, hashing: bool) -> tuple[int, str | None]:
    fd = os.open(path / rel, os.O_RDONLY | FILE_FLAGS)
    try:
        os.fsync(fd)
        if not hashing:
            return os.fstat(fd).st_size, None
        sha, size = sha256_fd(fd)
        return size, sha
    finally:
        os.close(fd)


def _write_share(tmp: Path, rank: int, files: Files) -> None:
    target = tmp / f"{_SHARE}{rank}.json"
    part = tmp / f".{_SHARE}{rank}.tmp"
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | FILE_FLAGS, 0o644)
    try:
        write_all(fd, json.dumps(files).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(part, target)


def _read_shares(tmp: Path, world_size: int) -> dict[str, tuple[int, str | None]]:
    out: dict[str, tuple[int, str | None]] = {}
    for rank in range(world_size):
        share = tmp / f"{_SHARE}{rank}.json"
        try:
            doc = json.loads(share.read_bytes())
        except FileNotFoundError:
            raise CheckpointError(f"rank {rank} did not finish its part of {tmp}") from None
        for rel, size, sha in doc:
            out[rel] = (size, sha)
    return out


def _prepare(tmp: Path) -> int:
    """Create ``tmp`` empty and hold an exclusive lock on it; a leftover of a killed writer is
    removed, one whose writer is alive is an error."""
    try:
        fd = os.open(tmp, _DIR_FLAGS)
    except FileNotFoundError:
        pass
    else:
        try:
            if not lock(fd, exclusive=True, blocking=False):
                raise FileExistsError(errno.EEXIST, "being written by another process", str(tmp))
        finally:
            os.close(fd)
        shutil.rmtree(tmp)
    os.mkdir(tmp)
    fd = os.open(tmp, _DIR_FLAGS)
    lock(fd, exclusive=True, blocking=False)
    return fd


@contextlib.contextmanager
def save_dir(
    path: str | os.PathLike[str],
    *,
    pattern: str = DEFAULT_CHECKPOINT_PATTERN,
    rank: int = 0,
    world_size: int = 1,
    barrier: Callable[[], object] | None = None,
    hashing: bool = True,
) -> Iterator[Path]:
    """Write a step directory so that its final name never holds a partial checkpoint::

        with checkpoint.save_dir("/ckpt/step-500", pattern="step-{step}") as tmp:
            torch.distributed.checkpoint.save(state, checkpoint_id=tmp)

    Yields ``<path>.part``, for the script or the framework to fill. On a clean exit every
    file and directory under it is fsynced and hashed, the directory is renamed to ``path``,
    the parent fsynced, and then one record (each file's size and SHA-256) committed the same
    way as a file's. Killed at any point, ``path`` does not exist or holds the whole
    checkpoint; until the record lands it is not committed (neither :func:`latest` nor the
    exporter calls it complete, unless the framework's own marker is there). An exception
    inside the block removes ``<path>.part`` (single process). ``path`` must not exist.

    Several ranks (``world_size`` > 1): every rank enters with its ``rank`` and the same
    ``barrier`` (``torch.distributed.barrier``, or any callable all ranks call), and writes
    its own files. Rank 0 prepares the directory before the first barrier; on exit, after a
    second one (every rank's files are in), every rank fsyncs every file it can see and hashes
    its share (file ``i`` of the sorted list goes to rank ``i % world_size``); after a third,
    rank 0 checks that the shares cover every file, renames and commits; a fourth makes every
    rank return only once it is committed.
    A rank that raises inside the block does not reach the barrier: the others wait there as
    in any collective, and the ``.part`` directory left behind is removed by the next save of
    that step.
    """
    final = Path(path)
    step = _dir_step(final, pattern)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} of world_size {world_size}")
    if world_size > 1 and barrier is None:
        raise ValueError("several ranks need a barrier (e.g. torch.distributed.barrier)")
    sync: Callable[[], object] = barrier if barrier is not None else (lambda: None)
    tmp = final.with_name(final.name + PARTIAL_SUFFIX)
    lock_fd = None
    if rank == 0:
        if os.path.lexists(final):
            raise FileExistsError(errno.EEXIST, "checkpoint directory already exists", str(final))
        lock_fd = _prepare(tmp)
    try:
        sync()
        ok = False
        try:
            yield tmp
            ok = True
        finally:
            if not ok and rank == 0 and world_size == 1:
                shutil.rmtree(tmp, ignore_errors=True)
        sync()  # every rank's files are in
        tree = _tree(tmp)
        share: Files = []
        for i, (rel, _st) in enumerate(tree):
            if i % world_size == rank:
                size, sha = _fsync_and_hash(tmp, rel, hashing)
                share.append((rel, size, sha))
            else:
                with contextlib.suppress(FileNotFoundError):
                    _fsync_and_hash(tmp, rel, False)
        if world_size > 1:
            _write_share(tmp, rank, share)
        sync()
        if rank == 0:
            _commit(final, tmp, step, tree, share, world_size)
        sync()
    finally:
        if lock_fd is not None:
            os.close(lock_fd)


def _commit(
    final: Path,
    tmp: Path,
    step: int,
    tree: list[tuple[str, os.stat_result]],
    share: Files,
    world_size: int,
) -> Record:
    """Rank 0, all ranks done: check, fsync, rename, fsync, record."""
    known = {rel: (size, sha) for rel, size, sha in share}
    if world_size > 1:
        known = _read_shares(tmp, world_size)
        for r in range(world_size):
            os.unlink(tmp / f"{_SHARE}{r}.json")
    now = _tree(tmp)
    files: Files = []
    for rel, st in now:
        got = known.get(rel)
        if got is None or got[0] != st.st_size:
            raise CheckpointError(
                f"{tmp / rel} changed or appeared after the ranks hashed their files"
            )
        files.append((rel, got[0], got[1]))
    if len(files) != len(tree) or not files:
        raise CheckpointError(f"{tmp}: files came or went while it was committed, or none")
    for d in _subdirs(tmp):
        fsync_dir(d)
    parent = final.parent
    remove_record(parent, final.name)
    os.rename(tmp, final)  # fails on an existing non-empty directory: never replaces one
    fsync_dir(parent)
    record = Record(
        name=final.name,
        step=step,
        size=sum(size for _, size, _ in files),
        sha256=None,
        written=time.time(),
        files=tuple(files),
    )
    write_record(parent, record)
    return record


def mirror_dir(
    src: Path,
    mirror_dir: str | os.PathLike[str],
    *,
    pattern: str = DEFAULT_CHECKPOINT_PATTERN,
    layout: str = DEFAULT_LAYOUT,
    verify_hash: bool = True,
) -> Record:
    """Copy a committed step directory (``mirror`` on a directory): every file with the same
    discipline as a file's mirror, into ``<name>.part/``, checked against the source's record
    (or, for a framework's directory without one, the sizes read when it was judged), fsynced,
    renamed, then a record listing every file. The source directory is held with a shared
    lock during the copy, so that ``prune`` does not delete it."""
    name = src.name
    step = _dir_step(src, pattern)
    dst_dir = Path(mirror_dir)
    if os.path.realpath(dst_dir) == os.path.realpath(src.parent):
        raise ValueError(f"mirror directory {dst_dir} is the checkpoint's own directory")
    final = dst_dir / name
    if os.path.lexists(final):
        raise FileExistsError(errno.EEXIST, "already mirrored", str(final))
    sfd = os.open(src, _DIR_FLAGS)
    try:
        lock(sfd, exclusive=False, blocking=True)
        listing = read_listing(src.parent, CheckpointPattern(pattern), layout)
        committed = {d.name: d for d in listing.dirs}.get(name)
        if committed is None:
            raise CheckpointError(f"{src} is not a committed step directory: not mirroring it")
        st = os.fstat(sfd)
        now = os.stat(src, follow_symlinks=False)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise FileNotFoundError(errno.ENOENT, "replaced or pruned while opening", str(src))
        cut = len(name) + 1
        expected: dict[str, tuple[int, str | None]] = (
            committed.record.file_map()
            if committed.record is not None
            else {e.name[cut:]: (e.stat.st_size, None) for e in committed.files}
        )
        present = {e.name[cut:]: e.stat.st_size for e in committed.files}
        for rel, (size, _sha) in expected.items():
            if present.get(rel) != size:
                raise CheckpointError(
                    f"{src / rel} is {present.get(rel)} bytes but should be {size}: not mirroring"
                )
        tmp = final.with_name(name + PARTIAL_SUFFIX)
        lock_fd = _prepare(tmp)
        try:
            files: Files = []
            for rel in sorted(expected):
                size, want = expected[rel]
                files.append((rel, size, _copy_one(src / rel, tmp / rel, size, want, verify_hash)))
            for d in _subdirs(tmp):
                fsync_dir(d)
            remove_record(dst_dir, name)
            os.rename(tmp, final)
            fsync_dir(dst_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            os.close(lock_fd)
    finally:
        os.close(sfd)
    record = Record(
        name=name,
        step=step,
        size=sum(size for _, size, _ in files),
        sha256=None,
        written=time.time(),
        source=str(src.absolute()),
        files=tuple(files),
    )
    write_record(dst_dir, record)
    return record


def _copy_one(src: Path, dst: Path, size: int, want: str | None, hashing: bool) -> str | None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    sfd = os.open(src, os.O_RDONLY | FILE_FLAGS)
    try:
        if not stat.S_ISREG(os.fstat(sfd).st_mode):
            raise CheckpointError(f"{src} is not a regular file")
        dfd = os.open(dst, os.O_RDWR | os.O_CREAT | os.O_EXCL | FILE_FLAGS, 0o644)
        try:
            got = _copy(sfd, dfd, dst, size, hashing=hashing)
            if os.fstat(dfd).st_size != size:
                raise CheckpointError(f"copy {dst} is not {size} bytes")
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)
    if want is not None and got is not None and got != want:
        raise CheckpointError(f"copy {dst} does not match the SHA-256 recorded for {src}")
    return want or got
