"""The ``.part`` discipline every checkpoint writer follows: a final name never holds partial
content, a ``.part`` has one live writer (an flock the kernel drops when the writer dies), and a
file being read by a mirror is not deleted under it."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from types import ModuleType

from trainguard.shared.fileio import FILE_FLAGS
from trainguard.shared.pattern import CheckpointPattern

fcntl: ModuleType | None
try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

_FADVISE = getattr(os, "posix_fadvise", None)


class CheckpointError(Exception):
    """A checkpoint that must not be published or copied: a source smaller than its record, a
    copy that came out short, or content that does not match its recorded hash."""


def lock(fd: int, *, exclusive: bool, blocking: bool) -> bool:
    """flock the file: exclusive for a writer of a ``.part`` and for prune's unlink, shared for
    a mirror reading its source. Released by the kernel when the process dies, so a SIGKILL
    never leaves a stale lock."""
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
    """Open ``<final>.part`` for writing, empty, locked against a second writer. An orphan from
    a writer that was killed is reused; one whose writer is alive is an error."""
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
    """Ask the kernel to start writing a range back now (Linux: POSIX_FADV_DONTNEED on dirty
    pages starts asynchronous writeback and leaves them cached), so the disk works while the
    rest is written and the final fsync only waits for the tail. Where the platform has no
    fadvise this is a no-op, and the fsync does all the work, as before."""
    if _FADVISE is not None:
        with contextlib.suppress(OSError):
            _FADVISE(fd, offset, length, os.POSIX_FADV_DONTNEED)


def step_of(name: str, pattern: str) -> int:
    step = CheckpointPattern(pattern).step(name)
    if step is None:
        raise ValueError(
            f"{name!r} does not match the checkpoint pattern {pattern!r} (e.g. step_100.pt): "
            "the exporter would not see it"
        )
    return step
