"""``mirror``: copy a checkpoint to another directory with the same discipline as ``save``,
checked against the source's record before the copy is published."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import threading
import time
from pathlib import Path

from trainguard.checkpoint.part import (
    CheckpointError,
    discard,
    lock,
    open_part,
    start_writeback,
    step_of,
)
from trainguard.shared.fileio import FILE_FLAGS, HASH_CHUNK, fsync_dir, write_all
from trainguard.shared.manifest import Record, read_record, remove_record, write_record
from trainguard.shared.pattern import DEFAULT_CHECKPOINT_PATTERN, PARTIAL_SUFFIX
from trainguard.shared.steps import DEFAULT_LAYOUT

#: bytes per copy_file_range call: big enough for full speed, small enough to hash behind it
COPY_CHUNK = 16 * 1024 * 1024
#: bytes per read and write when the kernel cannot copy by itself
_FALLBACK_CHUNK = 8 * 1024 * 1024
_NOT_SUPPORTED = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF}


class _TailHasher:
    """Hashes the copy as it is being written, from a second descriptor that stays behind the
    copy's offset: the hash of what actually landed, at the cost of wall time only where
    hashing is slower than copying."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDONLY | FILE_FLAGS)
        self._sha = hashlib.sha256()
        self._cond = threading.Condition()
        self._target = 0
        self._done = False
        self._hashed = 0
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, name="trainguard-mirror-hash", daemon=True
        )
        self._thread.start()

    def advance(self, offset: int) -> None:
        with self._cond:
            self._target = offset
            self._cond.notify()

    def finish(self) -> tuple[str, int]:
        with self._cond:
            self._done = True
            self._cond.notify()
        self._thread.join()
        os.close(self._fd)
        if self._error is not None:
            raise self._error
        return self._sha.hexdigest(), self._hashed

    def abort(self) -> None:
        with contextlib.suppress(BaseException):
            self.finish()

    def _run(self) -> None:
        buf = bytearray(HASH_CHUNK)
        view = memoryview(buf)
        try:
            with open(self._fd, "rb", buffering=0, closefd=False) as raw:
                while True:
                    with self._cond:
                        while self._hashed >= self._target and not self._done:
                            self._cond.wait()
                        target, done = self._target, self._done
                    if self._hashed >= target and done:
                        return
                    while self._hashed < target:
                        n = raw.readinto(view[: min(len(view), target - self._hashed)])
                        if not n:
                            raise CheckpointError("copy is shorter than what was written")
                        self._sha.update(view[:n])
                        self._hashed += n
        except BaseException as exc:
            self._error = exc


class _Copier:
    """Kernel-side copy where the platform has one (copy_file_range, else sendfile), plain
    reads and writes otherwise; falls back once per copy, never silently short."""

    def __init__(self) -> None:
        self.method = "copy_file_range" if hasattr(os, "copy_file_range") else "sendfile"
        if self.method == "sendfile" and not hasattr(os, "sendfile"):
            self.method = "readwrite"

    def chunk(self, src: int, dst: int, count: int, offset: int) -> int:
        if self.method == "copy_file_range":
            try:
                n = os.copy_file_range(src, dst, count, offset, offset)
                if n:
                    return n
            except OSError as exc:
                if exc.errno not in _NOT_SUPPORTED:
                    raise
            self.method = "sendfile" if hasattr(os, "sendfile") else "readwrite"
        if self.method == "sendfile":
            try:
                os.lseek(dst, offset, os.SEEK_SET)
                n = os.sendfile(dst, src, offset, count)
                if n:
                    return n
            except OSError as exc:
                if exc.errno not in _NOT_SUPPORTED:
                    raise
            self.method = "readwrite"
        os.lseek(src, offset, os.SEEK_SET)
        data = os.read(src, min(count, _FALLBACK_CHUNK))
        os.lseek(dst, offset, os.SEEK_SET)
        write_all(dst, memoryview(data))
        return len(data)


def _copy(src: int, dst: int, part: Path, size: int, *, hashing: bool) -> str | None:
    """Copy ``size`` bytes, fsync, and return the SHA-256 of the copy when asked."""
    hasher = _TailHasher(part) if hashing else None
    try:
        copier = _Copier()
        copied = 0
        while copied < size:
            n = copier.chunk(src, dst, min(COPY_CHUNK, size - copied), copied)
            if n <= 0:
                raise CheckpointError(f"source ended after {copied} of {size} bytes")
            start_writeback(dst, copied, n)
            copied += n
            if hasher is not None:
                hasher.advance(copied)
        os.fsync(dst)  # while the hasher finishes the tail
    except BaseException:
        if hasher is not None:
            hasher.abort()
        raise
    if hasher is None:
        return None
    sha, hashed = hasher.finish()
    if hashed != size:
        raise CheckpointError(f"hashed {hashed} bytes of a {size}-byte copy")
    return sha


def mirror(
    path: str | os.PathLike[str],
    mirror_dir: str | os.PathLike[str],
    *,
    pattern: str = DEFAULT_CHECKPOINT_PATTERN,
    verify_hash: bool = True,
    layout: str = DEFAULT_LAYOUT,
) -> Record:
    """Copy a checkpoint to another directory (usually another filesystem) with the same
    discipline as :func:`save`: ``.part``, checked, fsync, rename, fsync, record.

    The source must match its own record (a truncated primary is never propagated); the copy
    must have the recorded size and, when ``verify_hash`` and the source has a recorded hash,
    that hash, before it is renamed. The copy is hashed while it is written, so on a disk
    slower than SHA-256 this costs almost nothing; ``verify_hash=False`` skips it (the exporter
    still verifies the mirror later against the hash carried into its record). The source is
    held with a shared lock so that :func:`prune` does not delete it mid-copy.

    A step directory is copied file by file the same way
    (:func:`trainguard.checkpoint.dirwriter.mirror_dir`): it must be committed (its record,
    or its framework's marker by ``layout``), and the copy is committed by renaming its
    ``.part`` directory, then one record lists every file.

    Example::

        path = f"/data/ckpt/step_{step}.pt"
        checkpoint.save(model.state_dict(), path)
        checkpoint.mirror(path, "/mnt/backup/ckpt")        # /mnt/backup/ckpt/step_<step>.pt
        checkpoint.mirror("/data/out/checkpoint-500", "/mnt/backup/out",
                          pattern="checkpoint-{step}")    # a step directory, file by file
    """
    src = Path(path)
    if stat.S_ISDIR(os.lstat(src).st_mode):
        from trainguard.checkpoint.dirwriter import mirror_dir as copy_dir

        return copy_dir(src, mirror_dir, pattern=pattern, layout=layout, verify_hash=verify_hash)
    name = src.name
    step = step_of(name, pattern)
    dst_dir = Path(mirror_dir)
    if os.path.realpath(dst_dir) == os.path.realpath(src.parent):
        raise ValueError(f"mirror directory {dst_dir} is the checkpoint's own directory")
    src_record = read_record(src.parent, name)
    sfd = os.open(src, os.O_RDONLY | FILE_FLAGS)
    try:
        lock(sfd, exclusive=False, blocking=True)
        st = os.fstat(sfd)
        now = os.stat(src, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise FileNotFoundError(errno.ENOENT, "replaced or pruned while opening", str(src))
        expected = src_record.size if src_record is not None else st.st_size
        if st.st_size != expected:
            raise CheckpointError(
                f"{src} is {st.st_size} bytes but its record says {expected}: not mirroring it"
            )
        want_sha = src_record.sha256 if src_record is not None else None
        part = dst_dir / (name + PARTIAL_SUFFIX)
        dfd = open_part(part)
        try:
            got_sha = _copy(sfd, dfd, part, expected, hashing=verify_hash)
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
    finally:
        os.close(sfd)
    record = Record(
        name=name,
        step=step,
        size=expected,
        sha256=want_sha or got_sha,
        written=time.time(),
        source=str(src.absolute()),
    )
    write_record(dst_dir, record)
    return record
