"""How trainguard opens, reads, hashes and commits files on both sides: never following a link,
never blocking on a FIFO, never leaking a descriptor into a child, and "unknown" mtimes kept
unknown. The training side writes with these; the exporter reads with the same rules."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
from collections.abc import Callable, Iterator
from typing import Any

HASH_CHUNK = 8 * 1024 * 1024

O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
O_BINARY = getattr(os, "O_BINARY", 0)
#: flags for every file trainguard opens: never follow a link, never leak into a child process,
#: never translate bytes (Windows text mode)
FILE_FLAGS = O_NOFOLLOW | O_CLOEXEC | O_BINARY
#: whether files can be opened and directories listed relative to an open directory (not on
#: Windows): then a directory checked once is the one read, whatever its path points to later
DIR_FD = os.open in os.supports_dir_fd and os.scandir in os.supports_fd


def touched_ns(st: os.stat_result) -> int | None:
    """The file's mtime, or None when it is unknown (0 or less, which NFS and some FUSE bridges
    return): unknown is never old. A file renamed into place with an old mtime (rsync,
    ``cp -p``) already has its full content, so the mtime alone says whether it may still be
    being written."""
    if st.st_mtime_ns <= 0:
        return None
    return st.st_mtime_ns


def settled(st: os.stat_result, now_ns: int, grace_ns: int) -> bool:
    """Untouched for at least the grace period: no longer possibly being written."""
    t = touched_ns(st)
    return t is not None and now_ns - t >= grace_ns


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a rename or unlink in ``directory`` durable (a no-op where directories cannot be
    opened, i.e. Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    except (PermissionError, IsADirectoryError):
        if os.name == "nt":
            return
        raise
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def replace_file(
    path: str | os.PathLike[str], payload: bytes, mode: int = 0o644, *, fsync: bool = False
) -> None:
    """Replace ``path`` atomically with ``payload``: a temp file in the same directory, created
    exclusively (a planted symlink is never followed), written (and fsynced with ``fsync``),
    then ``os.replace``d; the temp file is removed if anything fails. The directory is not
    fsynced: a reader of these small files can do with the previous one after a power cut."""
    target = os.fspath(path)
    head, name = os.path.split(target)
    tmp = os.path.join(head, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_CLOEXEC | O_BINARY, mode)
    try:
        try:
            write_all(fd, payload)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def is_link_error(exc: OSError) -> bool:
    """O_NOFOLLOW on a symbolic link fails with ELOOP (EMLINK on some BSDs)."""
    return exc.errno in (errno.ELOOP, errno.EMLINK)


def scandir_fd(dfd: int, path: str | os.PathLike[str]) -> Iterator[os.DirEntry[Any]]:
    """List an open directory where the platform can, else by path."""
    with os.scandir(dfd if DIR_FD else path) as it:
        yield from it


def sha256_fd(
    fd: int,
    *,
    before_read: Callable[[int], None] | None = None,
    chunk: int = HASH_CHUNK,
) -> tuple[str, int]:
    """SHA-256 and length of everything readable from ``fd`` (from its current position).
    ``before_read(n)`` is called before each read of up to n bytes (the verifier's rate limit).
    Reads into one reused buffer; hashlib releases the GIL on large updates."""
    h = hashlib.sha256()
    buf = bytearray(chunk)
    view = memoryview(buf)
    total = 0
    with open(fd, "rb", buffering=0, closefd=False) as raw:
        while True:
            if before_read is not None:
                before_read(chunk)
            n = raw.readinto(view)
            if not n:
                break
            h.update(view[:n])
            total += n
    return h.hexdigest(), total


def sha256_file(path: str | os.PathLike[str], **kwargs: Any) -> tuple[str, int]:
    fd = os.open(path, os.O_RDONLY | FILE_FLAGS)
    try:
        return sha256_fd(fd, **kwargs)
    finally:
        os.close(fd)
