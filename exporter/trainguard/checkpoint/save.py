"""``save`` and ``save_dir``: write a checkpoint so that its final name never holds partial content.

A checkpoint is one file or a directory per step. Once written, its record is committed (size
and SHA-256 of every file, hashed as the bytes pass) for ``latest``, ``prune`` and the exporter
to judge it by.

A step directory has the same guarantees as a file: written under ``<name>.part/``, every file
and directory fsynced, committed by renaming the directory, the parent fsynced, and only then
one record listing every file. Several ranks may fill one directory: each writes its own files,
and one record is committed once every rank's files are in.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, cast

from trainguard.checkpoint.outcomes import tracked
from trainguard.checkpoint.part import (
    CheckpointError,
    dir_step,
    discard,
    fsync_tree,
    open_part,
    open_part_dir,
    step_of,
    tree_files,
)
from trainguard.checkpoint.transfer import HashingWriter, fsync_and_hash
from trainguard.shared.fileio import (
    FILE_FLAGS,
    UntrustedFileError,
    fsync_dir,
    read_untrusted,
    write_all,
)
from trainguard.shared.loss_at_save import loss_finite
from trainguard.shared.manifest import MAX_DIR_RECORD_BYTES, Record, remove_record, write_record
from trainguard.shared.pattern import DEFAULT_CHECKPOINT_PATTERN, PARTIAL_SUFFIX


def _is_torch_module(obj: object) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def _serialize(obj: Any, writer: HashingWriter) -> None:
    if isinstance(obj, (bytes, bytearray, memoryview)):
        writer.write(obj)
    elif callable(obj) and not _is_torch_module(obj):
        obj(writer)
    else:
        import torch  # only now: bytes and callables never need it

        torch.save(obj, cast(IO[bytes], writer))


def save(
    obj: Any, path: str | os.PathLike[str], *, pattern: str = DEFAULT_CHECKPOINT_PATTERN
) -> Record:
    """Write a checkpoint so that its final name never holds partial content.

    ``obj`` is bytes, a callable that writes to the binary file it is given, or anything
    ``torch.save`` takes. Order: ``<path>.part`` written and hashed, fsync, the old record of
    this name (if any) removed, rename to ``path``, fsync the directory, then the new record
    (size, SHA-256) committed the same way. Killed before the record lands, the file is there
    but unrecorded, and neither :func:`latest` nor the exporter calls it complete. The record
    also says whether the loss this process's ``trainguard.Run`` reported last was finite
    (``loss_finite``; absent without a run or a loss): :func:`latest` skips a checkpoint saved
    with a NaN loss, and :func:`prune` keeps the newest one saved with a finite loss.

    Example::

        checkpoint.save(model.state_dict(), f"/data/ckpt/step_{step}.pt")   # via torch.save
        checkpoint.save(blob, "/data/ckpt/step_100.bin")                     # bytes as they are
        checkpoint.save(lambda f: f.write(blob), "/data/ckpt/step_100.bin")  # any writer
    """
    path = Path(path)
    with tracked(path.parent):  # its outcome counted for the exporter (outcomes.py)
        return _save(obj, path, pattern)


def _save(obj: Any, path: Path, pattern: str) -> Record:
    step = step_of(path.name, pattern)
    directory = path.parent
    part = path.with_name(path.name + PARTIAL_SUFFIX)
    fd = open_part(part)
    try:
        writer = HashingWriter(fd)
        try:
            _serialize(obj, writer)
            sha, size = writer.finish()
        finally:
            writer.close()
        os.fsync(fd)
        remove_record(directory, path.name)
    except BaseException:
        discard(part, fd)
        raise
    try:
        os.replace(part, path)
        fsync_dir(directory)
    finally:
        os.close(fd)
    record = Record(
        name=path.name,
        step=step,
        size=size,
        sha256=sha,
        written=time.time(),
        loss_finite=loss_finite(),
    )
    write_record(directory, record)
    return record


#: each rank's share of the hashes, inside the ``.part`` directory until the commit
_SHARE = ".trainguard-rank-"

Files = list[tuple[str, int, str | None]]


def _tree(path: Path) -> list[tuple[str, os.stat_result]]:
    """Every regular file under ``path`` but trainguard's share files (relative paths, sorted)."""
    return [(rel, st) for rel, st in tree_files(path) if not rel.startswith(_SHARE)]


def _write_share(tmp: Path, rank: int, files: Files) -> None:
    target = tmp / f"{_SHARE}{rank}.json"
    # named under the share prefix: a slower rank still listing the tree must not take it
    # for a checkpoint file (it sorts first, and every file's owner would shift)
    part = tmp / f"{_SHARE}{rank}.json.tmp"
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
        try:  # a share lists some of the files the record will: the record's cap holds
            doc = json.loads(read_untrusted(share, MAX_DIR_RECORD_BYTES)[0])
        except FileNotFoundError:
            raise CheckpointError(f"rank {rank} did not finish its part of {tmp}") from None
        except UntrustedFileError as exc:
            raise CheckpointError(str(exc)) from None
        for rel, size, sha in doc:
            out[rel] = (size, sha)
    return out


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
    """Write a step directory so that its final name never holds a partial checkpoint.

    Usage::

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
    # its outcome counted for the exporter (outcomes.py): any rank's failure, rank 0's success
    with tracked(final.parent, success=rank == 0):
        yield from _save_dir(final, pattern, rank, world_size, barrier, hashing)


def _save_dir(
    final: Path,
    pattern: str,
    rank: int,
    world_size: int,
    barrier: Callable[[], object] | None,
    hashing: bool,
) -> Iterator[Path]:
    step = dir_step(final, pattern)
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
        lock_fd = open_part_dir(tmp)
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
                size, sha = fsync_and_hash(tmp / rel, hashing)
                share.append((rel, size, sha))
            else:
                with contextlib.suppress(FileNotFoundError):
                    fsync_and_hash(tmp / rel, False)
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
    fsync_tree(tmp)
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
        loss_finite=loss_finite(),
    )
    write_record(parent, record)
    return record
