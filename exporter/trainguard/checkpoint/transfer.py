"""Moving checkpoint bytes and hashing them as they pass.

Two movers: the binary file ``save`` hands to ``torch.save`` (hashed while written, so the
record needs no second read) and the descriptor-level copy ``mirror`` makes (kernel-side where
it can, hashed from a second descriptor behind it). Nothing here names a checkpoint or a
record: ``save`` and ``mirror`` decide what the bytes are and when they are published.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from trainguard.checkpoint.part import CheckpointError, start_writeback
from trainguard.shared.fileio import FILE_FLAGS, HASH_CHUNK, sha256_fd, write_all

#: writes at least this big are hashed on a helper thread while they are written
WRITE_CHUNK = 16 * 1024 * 1024
#: smaller writes are gathered into one buffer of this size (torch.save writes many tiny records)
SMALL_WRITE = 1024 * 1024


class HashingWriter(io.RawIOBase):
    """The binary file ``save`` hands to torch.save or a writer callable, hashing as it writes.

    Bytes go straight to the ``.part`` descriptor and into SHA-256 as they pass, so the record
    needs no second read. A large piece is hashed on a helper thread while it is written (both
    release the GIL); the hash of a piece ends before ``write`` returns, because torch hands over a
    view of tensor memory that is only valid during the call.
    """

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd
        self._sha = hashlib.sha256()
        self._size = 0
        self._buf = bytearray()
        self._pool: ThreadPoolExecutor | None = None

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._size + len(self._buf)

    def write(self, b: Any) -> int:
        view = memoryview(b)
        if not view.c_contiguous:
            view = memoryview(view.tobytes())
        view = view.cast("B")
        n = view.nbytes
        if n < SMALL_WRITE:
            self._buf += view
            if len(self._buf) >= SMALL_WRITE:
                self._drain()
        else:
            self._drain()
            self._emit(view)
        return n

    def _drain(self) -> None:
        if self._buf:
            with memoryview(self._buf) as view:
                self._emit(view)
            self._buf = bytearray()

    def _emit(self, view: memoryview) -> None:
        for off in range(0, view.nbytes, WRITE_CHUNK):
            piece = view[off : off + WRITE_CHUNK]
            if piece.nbytes >= SMALL_WRITE * 4:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(1, thread_name_prefix="trainguard-hash")
                hashed = self._pool.submit(self._sha.update, piece)
                try:
                    write_all(self._fd, piece)
                finally:
                    hashed.result()
            else:
                self._sha.update(piece)
                write_all(self._fd, piece)
            start_writeback(self._fd, self._size, piece.nbytes)
            self._size += piece.nbytes

    def finish(self) -> tuple[str, int]:
        """Write what is buffered; the SHA-256 and size of everything written."""
        self._drain()
        return self._sha.hexdigest(), self._size

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        super().close()


#: bytes per copy_file_range call: big enough for full speed, small enough to hash behind it
COPY_CHUNK = 16 * 1024 * 1024
#: bytes per read and write when the kernel cannot copy by itself
_FALLBACK_CHUNK = 8 * 1024 * 1024
_NOT_SUPPORTED = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF}


class TailHasher:
    """Hashes a copy as it is being written, from a second descriptor behind the copy's offset.

    That hashes what actually landed, at the cost of wall time only where hashing is slower than
    copying.
    """

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


class Copier:
    """Copies between descriptors, kernel-side where the platform can, never silently short.

    Kernel-side is copy_file_range, else sendfile; plain reads and writes otherwise. It falls back
    once per copy.
    """

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


def copy_fd(src: int, dst: int, part: Path, size: int, *, hashing: bool) -> str | None:
    """Copy ``size`` bytes from ``src`` to ``dst`` (the open file at ``part``), and fsync.

    Return the SHA-256 of what landed when asked (read back behind the copy by a
    :class:`TailHasher`).
    """
    hasher = TailHasher(part) if hashing else None
    try:
        copier = Copier()
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


def fsync_and_hash(path: Path, hashing: bool) -> tuple[int, str | None]:
    """Flush a finished file to disk and read its size and (with ``hashing``) SHA-256.

    What a step directory's record needs of each file; sizes only for ``hashing=False``.
    """
    fd = os.open(path, os.O_RDONLY | FILE_FLAGS)
    try:
        os.fsync(fd)
        if not hashing:
            return os.fstat(fd).st_size, None
        sha, size = sha256_fd(fd)
        return size, sha
    finally:
        os.close(fd)
