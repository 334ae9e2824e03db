"""How trainguard opens, reads, hashes and commits files on both sides, safely.

They never follow a link, never block on a FIFO, never leak a descriptor into a child, and keep
"unknown" mtimes unknown. The training side writes with these; the exporter reads with the
same rules. Every file that anyone may have written (heartbeats, records, markers, requests) is
read by :func:`read_untrusted`, the one place its checks live.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import stat
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
    """The file's mtime, or None when it is unknown: unknown is never old.

    Unknown is 0 or less, which NFS and some FUSE bridges return. A file renamed into place with
    an old mtime (rsync, ``cp -p``) already has its full content, so the mtime alone says whether
    it may still be being written.
    """
    if st.st_mtime_ns <= 0:
        return None
    return st.st_mtime_ns


def settled(st: os.stat_result, now_ns: int, grace_ns: int) -> bool:
    """Untouched for at least the grace period: no longer possibly being written."""
    t = touched_ns(st)
    return t is not None and now_ns - t >= grace_ns


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a rename or unlink in ``directory`` durable.

    A no-op where directories cannot be opened, i.e. Windows.
    """
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
    """Replace ``path`` atomically with ``payload``, through a temp file in the same directory.

    The temp file is created exclusively (a planted symlink is never followed), written (and
    fsynced with ``fsync``), then ``os.replace``d; it is removed if anything fails. The directory
    is not fsynced: a reader of these small files can do with the previous one after a power cut.
    """
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


def remove_orphan_temps(path: str | os.PathLike[str], own_pid: int) -> None:
    """Remove the temp files :func:`replace_file` left for ``path`` when its writer was killed.

    Those are ``.<name>.<pid>.<random>.tmp`` of a pid that is gone, left mid-write; those of
    ``own_pid`` and of live processes are left alone.
    """
    import psutil  # only the writers clean up: the exporter never loads it for this

    head, name = os.path.split(os.fspath(path))
    prefix = f".{name}."
    with os.scandir(head or ".") as entries:
        for entry in entries:
            if not (entry.name.startswith(prefix) and entry.name.endswith(".tmp")):
                continue
            pid = entry.name[len(prefix) :].split(".", 1)[0]
            if pid.isdigit() and int(pid) != own_pid and not psutil.pid_exists(int(pid)):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def is_link_error(exc: OSError) -> bool:
    """O_NOFOLLOW on a symbolic link fails with ELOOP (EMLINK on some BSDs)."""
    return exc.errno in (errno.ELOOP, errno.EMLINK)


def is_not_a_dir_error(exc: OSError) -> bool:
    """Whether opening a directory (O_NOFOLLOW | O_DIRECTORY) failed on a link or a non-directory.

    That is, the name is a link (:func:`is_link_error`) or something other than a directory
    (ENOTDIR).
    """
    return is_link_error(exc) or exc.errno == errno.ENOTDIR


class UntrustedFileError(Exception):
    """A file that anyone may have written, refused: a link, not regular, too big, unreadable.

    Too big is over its size cap. ``str()`` is ``"<path>: <why>"``; each format's reader raises it
    again as its own error (a heartbeat's, a record's, a request's) with the same text.
    ``too_large`` tells the one refusal some readers treat as "present but not judged".
    """

    def __init__(self, path: str, why: str, *, too_large: bool = False) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path
        self.why = why
        self.too_large = too_large


#: how every untrusted file is opened: never through a link, never blocking on a FIFO planted
#: in its place, never leaked into a child
_UNTRUSTED_READ = os.O_RDONLY | FILE_FLAGS | O_NONBLOCK


def open_untrusted(
    path: str | os.PathLike[str], *, dir_fd: int | None = None
) -> tuple[int, os.stat_result]:
    """Open a file that anyone may have written for reading: its descriptor and its fstat.

    With ``dir_fd`` (where the platform can), the last part of ``path`` is opened relative to
    that already-opened directory, so a directory swapped for a link afterwards cannot
    redirect the read. FileNotFoundError when it is not there; :class:`UntrustedFileError`
    when it is a link, not a regular file, or cannot be opened.
    """
    source = os.fspath(path)
    if not O_NOFOLLOW:  # no O_NOFOLLOW (Windows): check first; the race is the best we can do
        try:
            if stat.S_ISLNK(os.lstat(source).st_mode):
                raise UntrustedFileError(source, "is a symbolic link; refused")
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise UntrustedFileError(source, f"cannot open: {exc.strerror or exc}") from None
    try:
        if DIR_FD and dir_fd is not None:
            fd = os.open(os.path.basename(source), _UNTRUSTED_READ, dir_fd=dir_fd)
        else:
            fd = os.open(source, _UNTRUSTED_READ)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if O_NOFOLLOW and is_link_error(exc):
            raise UntrustedFileError(source, "is a symbolic link; refused") from None
        raise UntrustedFileError(source, f"cannot open: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise UntrustedFileError(source, f"cannot open: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UntrustedFileError(source, "not a regular file; refused")
    return fd, st


def read_untrusted(
    path: str | os.PathLike[str],
    cap: int,
    *,
    dir_fd: int | None = None,
    refuse: Callable[[os.stat_result], str | None] | None = None,
) -> tuple[bytes, os.stat_result]:
    """Read a small file that anyone may have written: its content (up to ``cap`` bytes), fstat.

    Such files are heartbeats, records, markers, tracker files, snapshot requests. This is the one
    place their common checks live (opened as :func:`open_untrusted`, then a size above ``cap``
    refused before reading and again if the file grows while being read), so no reader can forget
    one. ``refuse(fstat)``, when given, says why the file opened is refused (its owner, say),
    before a byte is read. FileNotFoundError when it is not there; :class:`UntrustedFileError` for
    anything else.
    """
    source = os.fspath(path)
    fd, st = open_untrusted(source, dir_fd=dir_fd)
    try:
        refused = refuse(st) if refuse is not None else None
        if refused:
            raise UntrustedFileError(source, refused)
        if st.st_size > cap:
            raise UntrustedFileError(
                source,
                f"{st.st_size} bytes, larger than the {_limit(cap)} limit; refused",
                too_large=True,
            )
        chunks: list[bytes] = []
        total = 0
        while total <= cap:
            # what fstat said and one byte more (EOF, or a file that grew): no read allocates
            # a buffer far larger than the file
            want = max(st.st_size + 1 - total, _GROW_CHUNK)
            chunk = os.read(fd, min(cap + 1 - total, want, _READ_CHUNK))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as exc:
        raise UntrustedFileError(source, f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if total > cap:  # grew while being read
        raise UntrustedFileError(
            source, f"larger than the {_limit(cap)} limit; refused", too_large=True
        )
    return b"".join(chunks), st


#: the most one read asks for, and what it asks for beyond the size fstat gave
_READ_CHUNK = 1024 * 1024
_GROW_CHUNK = 4096


def _limit(cap: int) -> str:
    """A size cap as the refusals spell it: ``1 MiB``, ``64 KiB``, ``4097 bytes``."""
    for unit, size in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if cap >= size and cap % size == 0:
            return f"{cap // size} {unit}"
    return f"{cap} bytes"


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
    Reads into one reused buffer; hashlib releases the GIL on large updates.
    """
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
