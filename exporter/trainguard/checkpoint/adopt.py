"""``record_dir``: record a step directory a framework has finished writing in place.

The directory is, e.g., the Hugging Face Trainer's ``checkpoint-500/``; once recorded it is
complete at once and any later truncation of a file in it is caught.

A framework that renames nothing and writes no checksum leaves a directory that can only be
called complete once nothing in it has changed for the grace period, and that stays "complete"
when a file in it is cut short afterwards. Once the framework says it is done (its own event,
after its own save), every file is fsynced and hashed and one record lists each with its size
and SHA-256, as :func:`trainguard.checkpoint.save_dir` would have written it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from trainguard.checkpoint.part import fsync_tree, tree_files
from trainguard.checkpoint.transfer import fsync_and_hash
from trainguard.shared.fileio import fsync_dir
from trainguard.shared.loss_at_save import loss_finite
from trainguard.shared.manifest import Record, read_all_records, remove_record, write_record
from trainguard.shared.pattern import CheckpointPattern

__all__ = ["forget_removed", "record_dir"]


def record_dir(path: str | os.PathLike[str], *, pattern: str, hashing: bool = True) -> Record:
    """Fsync, hash and record the finished step directory ``path``.

    Its name is the pattern exactly (e.g. ``checkpoint-500`` for ``checkpoint-{step}``); the record
    replaces any record of that name. Call it only once the framework has finished writing the
    directory: a file written after it no longer matches the record, and the step is not complete (a
    file changing size while it is hashed is an error). ``hashing=False`` records sizes only.

    Raises ValueError for a name the pattern does not give a step, FileNotFoundError for a
    missing directory, ManifestError for a link in it, and ``OSError`` from the disk.
    """
    final = Path(path)
    step = CheckpointPattern(pattern).dir_step(final.name)
    if step is None:
        raise ValueError(
            f"{final.name!r} is not a step directory name of the pattern {pattern!r} (the "
            "pattern exactly, e.g. 'checkpoint-{step}' -> checkpoint-500)"
        )
    files: list[tuple[str, int, str | None]] = []
    for rel, st in tree_files(final):
        size, sha = fsync_and_hash(final / rel, hashing)
        if size != st.st_size:
            raise OSError(f"{final / rel} changed size while it was recorded: still being written")
        files.append((rel, size, sha))
    if not files:
        raise ValueError(f"{final} holds no file to record")
    fsync_tree(final)
    fsync_dir(final.parent)
    record = Record(
        name=final.name,
        step=step,
        size=sum(size for _, size, _ in files),
        sha256=None,
        written=time.time(),
        files=tuple(files),
        loss_finite=loss_finite(),  # this process's run's loss, as save() records it
    )
    write_record(final.parent, record)
    return record


def forget_removed(directory: str | os.PathLike[str], *, pattern: str) -> list[str]:
    """Remove the records of step directories of ``pattern`` that no longer exist.

    They were deleted by their framework's own rotation (e.g. ``save_total_limit``). Returns
    the names removed.
    """
    where = Path(directory)
    pat = CheckpointPattern(pattern)
    gone = []
    for name, rec in read_all_records(where).items():
        if (
            rec.files is not None
            and pat.dir_step(name) is not None
            and not os.path.lexists(where / name)
            and remove_record(where, name)
        ):
            gone.append(name)
    return gone
