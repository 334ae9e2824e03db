"""``save``: write a checkpoint and its record, hashing the bytes as they pass."""

from __future__ import annotations

import hashlib
import io
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, cast

from trainguard.checkpoint.part import discard, open_part, start_writeback, step_of
from trainguard.shared.fileio import fsync_dir, write_all
from trainguard.shared.manifest import Record, remove_record, write_record
from trainguard.shared.pattern import DEFAULT_CHECKPOINT_PATTERN, PARTIAL_SUFFIX

#: writes at least this big are hashed on a helper thread while they are written
WRITE_CHUNK = 16 * 1024 * 1024
#: smaller writes are gathered into one buffer of this size (torch.save writes many tiny records)
SMALL_WRITE = 1024 * 1024


class _HashingWriter(io.RawIOBase):
    """The binary file ``save`` hands to torch.save or a writer callable: bytes go straight to
    the ``.part`` descriptor and into SHA-256 as they pass, so the record needs no second read.
    A large piece is hashed on a helper thread while it is written (both release the GIL); the
    hash of a piece ends before ``write`` returns, because torch hands over a view of tensor
    memory that is only valid during the call."""

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


def _is_torch_module(obj: object) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def _serialize(obj: Any, writer: _HashingWriter) -> None:
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
    but unrecorded, and neither :func:`latest` nor the exporter calls it complete.

    Example::

        checkpoint.save(model.state_dict(), f"/data/ckpt/step_{step}.pt")   # via torch.save
        checkpoint.save(blob, "/data/ckpt/step_100.bin")                     # bytes as they are
        checkpoint.save(lambda f: f.write(blob), "/data/ckpt/step_100.bin")  # any writer
    """
    path = Path(path)
    step = step_of(path.name, pattern)
    directory = path.parent
    part = path.with_name(path.name + PARTIAL_SUFFIX)
    fd = open_part(part)
    try:
        writer = _HashingWriter(fd)
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
    record = Record(name=path.name, step=step, size=size, sha256=sha, written=time.time())
    write_record(directory, record)
    return record
