"""Crash-safe checkpoints for training scripts: a checkpoint only gets its final name once it is
whole and on disk, its size and SHA-256 are recorded for the exporter to judge it by, mirrors
are checked against that record before they are published, and pruning never deletes what is
being written, copied, or of unknown age.

    from trainguard import checkpoint
    checkpoint.save(model.state_dict(), "/data/ckpt/step_100.pt")   # torch.save, crash-safe
    checkpoint.mirror("/data/ckpt/step_100.pt", "/mnt/backup/ckpt")
    checkpoint.prune("/data/ckpt", keep=12, mirrors=["/mnt/backup/ckpt"])
    state = torch.load(checkpoint.latest("/data/ckpt"))

torch is imported only when an object has to go through ``torch.save``. Checkpoints are single
regular files (a directory per step is not supported). Locking uses ``flock`` where the platform
has it (POSIX); elsewhere the grace period alone protects files in flight.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import stat
import sys
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO, Any, cast

from trainguard.config import DEFAULT_CHECKPOINT_PATTERN
from trainguard.manifest import (
    FILE_FLAGS,
    HASH_CHUNK,
    MANIFEST_DIR,
    PARTIAL_SUFFIX,
    CheckpointPattern,
    Judged,
    Listing,
    Record,
    fsync_dir,
    judge,
    read_listing,
    read_record,
    remove_record,
    settled,
    sha256_file,
    write_record,
)

fcntl: ModuleType | None
try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

__all__ = ["Checkpoint", "CheckpointError", "latest", "mirror", "prune", "save"]

#: writes at least this big are hashed on a helper thread while they are written
WRITE_CHUNK = 16 * 1024 * 1024
#: smaller writes are gathered into one buffer of this size (torch.save writes many tiny records)
SMALL_WRITE = 1024 * 1024
#: bytes per copy_file_range call: big enough for full speed, small enough to hash behind it
COPY_CHUNK = 16 * 1024 * 1024
#: bytes per read and write when the kernel cannot copy by itself
_FALLBACK_CHUNK = 8 * 1024 * 1024

_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_FADVISE = getattr(os, "posix_fadvise", None)
_NOT_SUPPORTED = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF}


class CheckpointError(Exception):
    """A checkpoint that must not be published or copied: a source smaller than its record, a
    copy that came out short, or content that does not match its recorded hash."""


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint as :func:`latest` finds it; usable wherever a path is
    (``torch.load(latest(d))``)."""

    path: Path
    step: int
    size: int
    sha256: str | None

    def __fspath__(self) -> str:
        return str(self.path)


def _lock(fd: int, *, exclusive: bool, blocking: bool) -> bool:
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


def _open_part(part: Path) -> int:
    """Open ``<final>.part`` for writing, empty, locked against a second writer. An orphan from
    a writer that was killed is reused; one whose writer is alive is an error."""
    fd = os.open(part, os.O_RDWR | os.O_CREAT | FILE_FLAGS, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CheckpointError(f"{part} is not a regular file")
        if not _lock(fd, exclusive=True, blocking=False):
            raise FileExistsError(errno.EEXIST, "being written by another process", str(part))
        os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _discard(part: Path, fd: int) -> None:
    """Remove a ``.part`` this process still holds the lock on (a failed write)."""
    with contextlib.suppress(OSError):
        os.unlink(part)
    os.close(fd)


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing a range back now (Linux: POSIX_FADV_DONTNEED on dirty
    pages starts asynchronous writeback and leaves them cached), so the disk works while the
    rest is written and the final fsync only waits for the tail. Where the platform has no
    fadvise this is a no-op, and the fsync does all the work, as before."""
    if _FADVISE is not None:
        with contextlib.suppress(OSError):
            _FADVISE(fd, offset, length, os.POSIX_FADV_DONTNEED)


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        n = os.write(fd, view)
        view = view[n:]


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
                    _write_all(self._fd, piece)
                finally:
                    hashed.result()
            else:
                self._sha.update(piece)
                _write_all(self._fd, piece)
            _start_writeback(self._fd, self._size, piece.nbytes)
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


def _step_of(name: str, pattern: str) -> int:
    step = CheckpointPattern(pattern).step(name)
    if step is None:
        raise ValueError(
            f"{name!r} does not match the checkpoint pattern {pattern!r} (e.g. step_100.pt): "
            "the exporter would not see it"
        )
    return step


def save(
    obj: Any, path: str | os.PathLike[str], *, pattern: str = DEFAULT_CHECKPOINT_PATTERN
) -> Record:
    """Write a checkpoint so that its final name never holds partial content.

    ``obj`` is bytes, a callable that writes to the binary file it is given, or anything
    ``torch.save`` takes. Order: ``<path>.part`` written and hashed, fsync, the old record of
    this name (if any) removed, rename to ``path``, fsync the directory, then the new record
    (size, SHA-256) committed the same way. Killed before the record lands, the file is there
    but unrecorded, and neither :func:`latest` nor the exporter calls it complete.
    """
    path = Path(path)
    step = _step_of(path.name, pattern)
    directory = path.parent
    part = path.with_name(path.name + PARTIAL_SUFFIX)
    fd = _open_part(part)
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
        _discard(part, fd)
        raise
    try:
        os.replace(part, path)
        fsync_dir(directory)
    finally:
        os.close(fd)
    record = Record(name=path.name, step=step, size=size, sha256=sha, written=time.time())
    write_record(directory, record)
    return record


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
        _write_all(dst, memoryview(data))
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
            _start_writeback(dst, copied, n)
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
) -> Record:
    """Copy a checkpoint to another directory (usually another filesystem) with the same
    discipline as :func:`save`: ``.part``, checked, fsync, rename, fsync, record.

    The source must match its own record (a truncated primary is never propagated); the copy
    must have the recorded size and, when ``verify_hash`` and the source has a recorded hash,
    that hash, before it is renamed. The copy is hashed while it is written, so on a disk
    slower than SHA-256 this costs almost nothing; ``verify_hash=False`` skips it (the exporter
    still verifies the mirror later against the hash carried into its record). The source is
    held with a shared lock so that :func:`prune` does not delete it mid-copy.
    """
    src = Path(path)
    name = src.name
    step = _step_of(name, pattern)
    dst_dir = Path(mirror_dir)
    if os.path.realpath(dst_dir) == os.path.realpath(src.parent):
        raise ValueError(f"mirror directory {dst_dir} is the checkpoint's own directory")
    src_record = read_record(src.parent, name)
    sfd = os.open(src, os.O_RDONLY | FILE_FLAGS)
    try:
        _lock(sfd, exclusive=False, blocking=True)
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
        dfd = _open_part(part)
        try:
            got_sha = _copy(sfd, dfd, part, expected, hashing=verify_hash)
            copied = os.fstat(dfd).st_size
            if copied != expected:
                raise CheckpointError(f"copy {part} is {copied} bytes, expected {expected}")
            if want_sha is not None and got_sha is not None and got_sha != want_sha:
                raise CheckpointError(f"copy {part} does not match the SHA-256 recorded for {src}")
            remove_record(dst_dir, name)
        except BaseException:
            _discard(part, dfd)
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


def _unlink_unused(path: Path, listed: os.stat_result) -> bool:
    """Delete ``path`` only if it is still the file that was judged and nobody holds a lock on
    it (a mirror copying from it). False, and nothing deleted, otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | FILE_FLAGS | _O_NONBLOCK)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        same = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if same != (listed.st_dev, listed.st_ino, listed.st_size, listed.st_mtime_ns):
            return False  # rewritten since it was judged
        if not _lock(fd, exclusive=True, blocking=False):
            return False
        now = os.stat(path, follow_symlinks=False)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return False
        os.unlink(path)
        return True
    finally:
        os.close(fd)


def _remove_stale_records(listing: Listing, now_ns: int, grace_ns: int) -> None:
    """Records whose checkpoint file no longer exists, and temporaries of killed writers, once
    settled. A record whose file exists is never touched, whatever its name's pattern."""
    mdir = listing.directory / MANIFEST_DIR
    try:
        with os.scandir(mdir) as it:
            entries = list(it)
    except FileNotFoundError:
        return
    for entry in entries:
        name = entry.name
        if name.startswith("."):
            stale = name.endswith(".tmp")
        elif name.endswith(".json"):
            stale = not os.path.lexists(listing.directory / name[: -len(".json")])
        else:
            stale = False
        if not stale:
            continue
        with contextlib.suppress(OSError):
            if settled(entry.stat(follow_symlinks=False), now_ns, grace_ns):
                os.unlink(entry.path)


def prune(
    directory: str | os.PathLike[str],
    keep: int,
    *,
    mirrors: Iterable[str | os.PathLike[str]] = (),
    grace: float = 300.0,
    pattern: str = DEFAULT_CHECKPOINT_PATTERN,
) -> list[Path]:
    """Keep the newest ``keep`` complete checkpoints of ``directory`` and delete older ones,
    in the mirrors too (aligned on the same steps). Returns what was deleted.

    Never deleted: a ``.part``; a file touched within ``grace`` seconds; a file whose mtime is 0
    or unreadable (unknown is not old); the newest complete checkpoint of each location; a file
    another process holds locked (a mirror copying it); anything at all when fewer than
    ``keep`` complete checkpoints exist. Every location is read before anything is deleted; a
    location that cannot be read raises and nothing is deleted.
    """
    if keep < 1:
        raise ValueError("keep must be at least 1: the newest complete checkpoint is never pruned")
    pat = CheckpointPattern(pattern)
    now_ns = time.time_ns()
    grace_ns = int(grace * 1e9)
    primary = read_listing(directory, pat)
    listings = [primary, *(read_listing(m, pat) for m in mirrors)]
    judged: list[list[Judged]] = [judge(primary, now_ns=now_ns, grace_ns=grace_ns)]
    judged += [judge(m, now_ns=now_ns, grace_ns=grace_ns, primary=primary) for m in listings[1:]]
    steps = sorted({j.entry.step for j in judged[0] if j.complete}, reverse=True)
    if len(steps) < keep:
        return []
    oldest_kept = steps[keep - 1]
    deleted: list[Path] = []
    for listing, files in zip(listings, judged, strict=True):
        newest = max((j.entry.step for j in files if j.complete), default=None)
        removed = False
        for j in files:
            step = j.entry.step
            if step >= oldest_kept or step == newest or not j.settled:
                continue
            path = listing.directory / j.entry.name
            if _unlink_unused(path, j.entry.stat):
                deleted.append(path)
                removed = True
                if j.entry.name in listing.records:
                    remove_record(listing.directory, j.entry.name)
        if removed:
            fsync_dir(listing.directory)
        _remove_stale_records(listing, now_ns, grace_ns)
    return deleted


def latest(
    directory: str | os.PathLike[str],
    *,
    verify_hash: bool = False,
    primary: str | os.PathLike[str] | None = None,
    grace: float = 300.0,
    pattern: str = DEFAULT_CHECKPOINT_PATTERN,
) -> Checkpoint | None:
    """The newest complete checkpoint: its size matches its record (for a mirror without a
    record, the ``primary`` directory's record, or the primary file once ``grace`` has passed),
    its mtime is known, and with ``verify_hash`` its content hashes to the recorded SHA-256
    (a file without a recorded hash then does not qualify). None when there is none."""
    pat = CheckpointPattern(pattern)
    listing = read_listing(directory, pat)
    plisting = read_listing(primary, pat) if primary is not None else None
    judged = judge(listing, now_ns=time.time_ns(), grace_ns=int(grace * 1e9), primary=plisting)
    complete = sorted(
        (j for j in judged if j.complete), key=lambda j: (j.entry.step, j.entry.name), reverse=True
    )
    for j in complete:
        path = listing.directory / j.entry.name
        if verify_hash:
            if j.expected_sha256 is None:
                continue
            try:
                sha, size = sha256_file(path)
            except OSError:
                continue
            if sha != j.expected_sha256 or size != j.expected_size:
                continue
        return Checkpoint(
            path=path, step=j.entry.step, size=j.entry.stat.st_size, sha256=j.expected_sha256
        )
    return None
