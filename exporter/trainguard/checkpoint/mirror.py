"""``mirror`` and ``mirror_dir``: copy a committed checkpoint (a file or a step directory).

The copy goes to another directory with the same discipline as ``save``, checked against the
source's record before it is published. Both open and close the same way
(:func:`_held_source`, :func:`_commit_copy`): the source held with a shared lock so that
``prune`` does not delete it mid-copy, and a record naming the source committed last.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from trainguard.checkpoint.outcomes import tracked
from trainguard.checkpoint.part import (
    DIR_FLAGS,
    CheckpointError,
    dir_step,
    discard,
    fsync_tree,
    lock,
    open_part,
    open_part_dir,
    step_of,
)
from trainguard.checkpoint.transfer import copy_fd
from trainguard.shared.fileio import FILE_FLAGS, UntrustedFileError, fsync_dir, open_untrusted
from trainguard.shared.listing import read_listing
from trainguard.shared.manifest import (
    ManifestError,
    Record,
    read_record,
    remove_record,
    write_record,
)
from trainguard.shared.pattern import DEFAULT_CHECKPOINT_PATTERN, PARTIAL_SUFFIX, CheckpointPattern
from trainguard.shared.steps import DEFAULT_LAYOUT

#: a step directory's files as its record lists them: (relative path, size, SHA-256)
Files = list[tuple[str, int, str | None]]


def mirror(
    path: str | os.PathLike[str],
    mirror_dir: str | os.PathLike[str],
    *,
    pattern: str = DEFAULT_CHECKPOINT_PATTERN,
    verify_hash: bool = True,
    layout: str = DEFAULT_LAYOUT,
) -> Record:
    """Copy a checkpoint to another directory (usually another filesystem), checked, crash-safe.

    The discipline is the same as :func:`~trainguard.checkpoint.save`'s: ``.part``, checked,
    fsync, rename, fsync, record.

    The source must match its own record (a truncated primary is never propagated); the copy
    must have the recorded size and, when ``verify_hash`` and the source has a recorded hash,
    that hash, before it is renamed. The copy is hashed while it is written, so on a disk
    slower than SHA-256 this costs almost nothing; ``verify_hash=False`` skips it (the exporter
    still verifies the mirror later against the hash carried into its record). The source is
    held with a shared lock so that :func:`~trainguard.checkpoint.prune` does not delete it
    mid-copy.

    A step directory is copied file by file the same way (:func:`mirror_dir`): it must be
    committed (its record, or its framework's marker by ``layout``), and the copy is committed
    by renaming its ``.part`` directory, then one record lists every file.

    Example::

        path = f"/data/ckpt/step_{step}.pt"
        checkpoint.save(model.state_dict(), path)
        checkpoint.mirror(path, "/mnt/backup/ckpt")        # /mnt/backup/ckpt/step_<step>.pt
        checkpoint.mirror("/data/out/checkpoint-500", "/mnt/backup/out",
                          pattern="checkpoint-{step}")    # a step directory, file by file
    """
    src = Path(path)
    with tracked(mirror_dir):  # its outcome counted for the exporter (outcomes.py)
        if stat.S_ISDIR(os.lstat(src).st_mode):
            return _copy_tree(src, Path(mirror_dir), pattern, layout, verify_hash)
        return _copy_file(src, Path(mirror_dir), pattern, verify_hash)


def _copy_file(src: Path, dst_dir: Path, pattern: str, verify_hash: bool) -> Record:
    """``mirror`` of a single file."""
    name = src.name
    step = step_of(name, pattern)
    with _held_source(src, dst_dir, directory=False) as (sfd, st):
        src_record = read_record(src.parent, name)
        expected = src_record.size if src_record is not None else st.st_size
        if st.st_size != expected:
            raise CheckpointError(
                f"{src} is {st.st_size} bytes but its record says {expected}: not mirroring it"
            )
        want_sha = src_record.sha256 if src_record is not None else None
        part = dst_dir / (name + PARTIAL_SUFFIX)
        dfd = open_part(part)
        try:
            got_sha = copy_fd(sfd, dfd, part, expected, hashing=verify_hash)
            copied = os.fstat(dfd).st_size
            if copied != expected:
                raise CheckpointError(f"copy {part} is {copied} bytes, expected {expected}")
            if want_sha is not None and got_sha is not None and got_sha != want_sha:
                raise CheckpointError(f"copy {part} does not match the SHA-256 recorded for {src}")
            remove_record(dst_dir, name)
        except BaseException:
            discard(part, dfd)
            raise
        try:
            os.replace(part, dst_dir / name)
            fsync_dir(dst_dir)
        finally:
            os.close(dfd)
    return _commit_copy(src, dst_dir, step, expected, want_sha or got_sha, None)


def mirror_dir(
    src: Path,
    mirror_dir: str | os.PathLike[str],
    *,
    pattern: str = DEFAULT_CHECKPOINT_PATTERN,
    layout: str = DEFAULT_LAYOUT,
    verify_hash: bool = True,
) -> Record:
    """Copy a committed step directory (``mirror`` on a directory), file by file.

    Every file is copied with the same discipline as a file's mirror, into ``<name>.part/``,
    checked against the source's record (or, for a framework's directory without one, the sizes
    read when it was judged) and fsynced; the directory is then renamed, and a record listing
    every file committed. The source directory is held with a shared lock during the copy, so
    that ``prune`` does not delete it.
    """
    with tracked(mirror_dir):  # its outcome counted for the exporter (outcomes.py)
        return _copy_tree(Path(src), Path(mirror_dir), pattern, layout, verify_hash)


def _copy_tree(src: Path, dst_dir: Path, pattern: str, layout: str, verify_hash: bool) -> Record:
    """``mirror_dir``: a step directory copied file by file."""
    name = src.name
    step = dir_step(src, pattern)
    final = dst_dir / name
    with _held_source(src, dst_dir, directory=True):
        if os.path.lexists(final):
            raise FileExistsError(errno.EEXIST, "already mirrored", str(final))
        expected = _committed_files(src, pattern, layout)
        tmp = final.with_name(name + PARTIAL_SUFFIX)
        lock_fd = open_part_dir(tmp)
        try:
            files: Files = []
            for rel in sorted(expected):
                size, want = expected[rel]
                files.append((rel, size, _copy_one(src / rel, tmp / rel, size, want, verify_hash)))
            fsync_tree(tmp)
            remove_record(dst_dir, name)
            os.rename(tmp, final)
            fsync_dir(dst_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            os.close(lock_fd)
    size = sum(size for _, size, _ in files)
    return _commit_copy(src, dst_dir, step, size, None, tuple(files))


@contextlib.contextmanager
def _held_source(
    src: Path, dst_dir: Path, *, directory: bool
) -> Iterator[tuple[int, os.stat_result]]:
    """Open and hold a mirror's source: the opening both mirrors share.

    Refuse to mirror into the source's own directory, open the source (a step directory, or a
    file as every untrusted file is: never through a link, never waiting on a FIFO, a regular
    file only), hold a shared lock on it for the copy, and check that it is still the entry of
    that name.
    """
    if os.path.realpath(dst_dir) == os.path.realpath(src.parent):
        raise ValueError(f"mirror directory {dst_dir} is the checkpoint's own directory")
    sfd = os.open(src, DIR_FLAGS) if directory else _open_source(src)
    try:
        lock(sfd, exclusive=False, blocking=True)
        st = os.fstat(sfd)
        now = os.stat(src, follow_symlinks=False)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise FileNotFoundError(errno.ENOENT, "replaced or pruned while opening", str(src))
        yield sfd, st
    finally:
        os.close(sfd)


def _open_source(src: Path) -> int:
    """Open a checkpoint file to copy, by :func:`~trainguard.shared.fileio.open_untrusted`.

    Anything but a regular file is a CheckpointError naming it.
    """
    try:
        return open_untrusted(src)[0]
    except UntrustedFileError as exc:
        raise CheckpointError(str(exc)) from None


def _commit_copy(
    src: Path,
    dst_dir: Path,
    step: int,
    size: int,
    sha256: str | None,
    files: tuple[tuple[str, int, str | None], ...] | None,
) -> Record:
    """Commit the copy's record, naming its source: the closing both mirrors share.

    It runs once the copy has its final name. Whether the loss was finite when the source was
    saved is carried over from the source's record.
    """
    try:
        src_record = read_record(src.parent, src.name)
    except (ManifestError, OSError):
        src_record = None
    record = Record(
        name=src.name,
        step=step,
        size=size,
        sha256=sha256,
        written=time.time(),
        source=str(src.absolute()),
        files=files,
        loss_finite=None if src_record is None else src_record.loss_finite,
    )
    write_record(dst_dir, record)
    return record


def _committed_files(src: Path, pattern: str, layout: str) -> dict[str, tuple[int, str | None]]:
    """What a committed step directory must hold: relative path -> size, SHA-256 or None.

    That is its record's list, or for a framework's directory without one, the files it was
    judged by; CheckpointError when it is not committed or a file's size is not the one expected.
    """
    listing = read_listing(src.parent, CheckpointPattern(pattern), layout)
    committed = {d.name: d for d in listing.dirs}.get(src.name)
    if committed is None:
        raise CheckpointError(f"{src} is not a committed step directory: not mirroring it")
    cut = len(src.name) + 1
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
    return expected


def _copy_one(src: Path, dst: Path, size: int, want: str | None, hashing: bool) -> str | None:
    """Copy one file of a step directory into its ``.part`` tree; the SHA-256 to record."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    sfd = _open_source(src)
    try:
        dfd = os.open(dst, os.O_RDWR | os.O_CREAT | os.O_EXCL | FILE_FLAGS, 0o644)
        try:
            got = copy_fd(sfd, dfd, dst, size, hashing=hashing)
            if os.fstat(dfd).st_size != size:
                raise CheckpointError(f"copy {dst} is not {size} bytes")
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)
    if want is not None and got is not None and got != want:
        raise CheckpointError(f"copy {dst} does not match the SHA-256 recorded for {src}")
    return want or got
