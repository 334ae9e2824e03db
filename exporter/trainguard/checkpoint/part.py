"""The ``.part`` discipline every checkpoint writer follows.

The writers are ``save`` and ``mirror``, of a file or of a step directory: a final name never
holds partial content, a ``.part`` has one live writer (an flock the kernel drops when the
writer dies), and a file being read by a mirror is not deleted under it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from pathlib import Path
from types import ModuleType

from trainguard.shared.fileio import FILE_FLAGS, O_CLOEXEC, O_DIRECTORY, fsync_dir
from trainguard.shared.pattern import CheckpointPattern
from trainguard.shared.stepdir import walk

fcntl: ModuleType | None
try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

_FADVISE = getattr(os, "posix_fadvise", None)
#: how a step directory (or its ``.part``) is opened: to lock it, never through a link
DIR_FLAGS = os.O_RDONLY | O_DIRECTORY | FILE_FLAGS | O_CLOEXEC


class CheckpointError(Exception):
    """A checkpoint that must not be published or copied.

    A source smaller than its record, a copy that came out short, or content that does not match
    its recorded hash.
    """


def lock(fd: int, *, exclusive: bool, blocking: bool) -> bool:
    """Lock the file with flock, exclusive or shared.

    Exclusive for a writer of a ``.part`` and for prune's unlink, shared for a mirror reading its
    source. Released by the kernel when the process dies, so a SIGKILL never leaves a stale lock.
    """
    if fcntl is None:
        return True
    op = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    if not blocking:
        op |= fcntl.LOCK_NB
    try:
        fcntl.flock(fd, op)
    except BlockingIOError:
        return False
    return True


def open_part(part: Path) -> int:
    """Open ``<final>.part`` for writing, empty, locked against a second writer.

    An orphan from a writer that was killed is reused; one whose writer is alive is an error.
    """
    fd = os.open(part, os.O_RDWR | os.O_CREAT | FILE_FLAGS, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CheckpointError(f"{part} is not a regular file")
        if not lock(fd, exclusive=True, blocking=False):
            raise FileExistsError(errno.EEXIST, "being written by another process", str(part))
        os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def discard(part: Path, fd: int) -> None:
    """Remove a ``.part`` this process still holds the lock on (a failed write)."""
    with contextlib.suppress(OSError):
        os.unlink(part)
    os.close(fd)


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing a range back now, so the final fsync only waits for the tail.

    On Linux, POSIX_FADV_DONTNEED on dirty pages starts asynchronous writeback and leaves them
    cached, so the disk works while the rest is written. Where the platform has no fadvise this
    is a no-op, and the fsync does all the work.
    """
    if _FADVISE is not None:
        with contextlib.suppress(OSError):
            _FADVISE(fd, offset, length, os.POSIX_FADV_DONTNEED)


def step_of(name: str, pattern: str) -> int:
    """The step in a checkpoint file's name; ValueError when the pattern does not match it."""
    step = CheckpointPattern(pattern).step(name)
    if step is None:
        raise ValueError(
            f"{name!r} does not match the checkpoint pattern {pattern!r} (e.g. step_100.pt): "
            "the exporter would not see it"
        )
    return step


def dir_step(path: Path, pattern: str) -> int:
    """The step in a step directory's name; ValueError when the pattern does not match it."""
    step = CheckpointPattern(pattern).dir_step(path.name)
    if step is None:
        raise ValueError(
            f"{path.name!r} is not a step directory name of the pattern {pattern!r} (the pattern "
            "exactly, e.g. 'checkpoint-{step}' -> checkpoint-500): the exporter would not see it"
        )
    return step


def open_part_dir(tmp: Path) -> int:
    """Create the ``.part`` directory ``tmp`` empty and hold an exclusive lock on it.

    The descriptor is returned; closing it releases the lock. A leftover of a killed writer is
    removed; one whose writer is alive is an error.
    """
    try:
        fd = os.open(tmp, DIR_FLAGS)
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
    fd = os.open(tmp, DIR_FLAGS)
    lock(fd, exclusive=True, blocking=False)
    return fd


def fsync_tree(path: Path) -> None:
    """Flush ``path`` and every directory under it to disk (fsync), deepest first.

    Every entry of the tree is then durable before the tree is renamed into place.
    """
    dirs = [Path(root) for root, _dirs, _files in os.walk(path)]
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        fsync_dir(d)


def tree_files(path: Path) -> list[tuple[str, os.stat_result]]:
    """Every regular file under the step directory ``path``: relative paths, sorted.

    Walked through an opened descriptor (:func:`~trainguard.shared.stepdir.walk`), so a link
    in the tree is an error rather than a way out of it.
    """
    fd = os.open(path, DIR_FLAGS)
    try:
        files = walk(fd, path, path.name, None).files
    finally:
        os.close(fd)
    return sorted(files)
