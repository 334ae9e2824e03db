"""Checkpoint files and their manifest records as they lie on disk: the one definition that the
library writing them (:mod:`trainguard.checkpoint`) and the exporter judging them
(:mod:`trainguard.collectors.checkpoints`) share, so the two never disagree on what is complete.

Layout: next to the checkpoints, a ``.trainguard/`` directory holds one small JSON record per
checkpoint, ``.trainguard/<checkpoint name>.json``. One file per record makes every commit a
single atomic rename with no read-modify-write, so writers in different processes (save,
mirror, prune) never lose each other's records, and a SIGKILL leaves at worst a temporary
``.<name>.<random>.tmp`` that readers ignore. The directory name has no step, so no checkpoint
pattern can match it.

Records are untrusted input for the exporter: read with a size cap, without following links,
with exact keys and types, and a record only ever names a plain file in its own directory.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import re
import secrets
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from trainguard.config import DEFAULT_CHECKPOINT_PATTERN, checkpoint_pattern_problem

MANIFEST_DIR = ".trainguard"
RECORD_SUFFIX = ".json"
PARTIAL_SUFFIX = ".part"
RECORD_VERSION = 1
#: a record is ~300 bytes; the cap leaves room for a long ``source`` path and nothing more
MAX_RECORD_BYTES = 16 * 1024
#: more records than this in one directory is not a checkpoint directory we can judge cheaply
MAX_RECORDS = 100_000
HASH_CHUNK = 8 * 1024 * 1024

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
#: flags for every file trainguard opens: never follow a link, never leak into a child process,
#: never translate bytes (Windows text mode)
FILE_FLAGS = _O_NOFOLLOW | _O_CLOEXEC | getattr(os, "O_BINARY", 0)
#: a record is opened without blocking on a FIFO planted in its place
_RECORD_READ = os.O_RDONLY | FILE_FLAGS | _O_NONBLOCK
_DIR_FD = os.open in os.supports_dir_fd and os.scandir in os.supports_fd
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_NOT_PLAIN = re.compile(r"[/\\:\x00-\x1f\x7f]")
_RECORD_KEYS = frozenset({"version", "name", "step", "size", "sha256", "written", "source"})
_MAX_INT = 2**63 - 1


class NotMounted(Exception):
    """A checkpoint location seen as a mount point is now a plain directory: its volume was
    unmounted."""


class ManifestError(Exception):
    """A manifest record or checkpoint directory entry that cannot be trusted (malformed, too
    big, a link, or naming something outside its directory)."""


@dataclass(frozen=True)
class Record:
    """What the writer knew when it committed a checkpoint."""

    name: str  # plain file name of the checkpoint, in the record's own directory
    step: int
    size: int  # bytes the file must have; for a mirror, the primary's expected size
    sha256: str | None  # lowercase hex of the content, None when the writer had none
    written: float  # Unix time of the commit
    source: str | None = None  # for a mirror: the file it was copied from

    def encode(self) -> bytes:
        return json.dumps(
            {
                "version": RECORD_VERSION,
                "name": self.name,
                "step": self.step,
                "size": self.size,
                "sha256": self.sha256,
                "written": self.written,
                "source": self.source,
            },
            sort_keys=True,
            allow_nan=False,
        ).encode()


def is_plain_name(name: str) -> bool:
    """A name that can only mean a file directly inside the directory it is looked up in
    (no separators, no parent, not hidden, no control characters)."""
    # separators, ':' (drive-relative names and NTFS streams on Windows), control characters
    return 0 < len(name) <= 255 and not name.startswith(".") and _NOT_PLAIN.search(name) is None


def _reject_constant(value: str) -> Any:
    raise ValueError(f"{value} is not a number")


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _int(doc: Mapping[str, Any], key: str) -> int:
    value = doc[key]
    if type(value) is not int or not 0 <= value <= _MAX_INT:
        raise ManifestError(f"{key}: expected an integer 0..2^63-1, got {value!r:.40}")
    return value


def parse_record(data: bytes, *, name: str) -> Record:
    """Parse one record; ``name`` is the checkpoint the record's file name says it is about.
    Anything but a well-formed record about exactly that plain name raises ManifestError."""
    if len(data) > MAX_RECORD_BYTES:
        raise ManifestError(f"larger than {MAX_RECORD_BYTES} bytes")
    try:
        doc = json.loads(
            data.decode("utf-8"), object_pairs_hook=_pairs, parse_constant=_reject_constant
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ManifestError(f"not a JSON record: {exc}") from None
    if not isinstance(doc, dict):
        raise ManifestError("not a JSON object")
    if set(doc) != _RECORD_KEYS:
        missing = sorted(_RECORD_KEYS - set(doc))
        extra = sorted(set(doc) - _RECORD_KEYS)
        raise ManifestError(f"unexpected keys (missing {missing}, unknown {extra})")
    if doc["version"] != RECORD_VERSION or type(doc["version"]) is not int:
        raise ManifestError(f"unsupported version {doc['version']!r:.40}")
    rec_name = doc["name"]
    if not isinstance(rec_name, str) or not is_plain_name(rec_name):
        raise ManifestError(
            f"name {rec_name!r:.80} is not a plain file name inside the checkpoint directory"
        )
    if rec_name != name:
        raise ManifestError(f"record file is for {name!r} but names {rec_name!r:.80}")
    sha = doc["sha256"]
    if sha is not None and (not isinstance(sha, str) or not _SHA256_RE.fullmatch(sha)):
        raise ManifestError(f"sha256: expected 64 lowercase hex digits or null, got {sha!r:.80}")
    written = doc["written"]
    # an integer of any size is valid JSON, but not every one converts to a float
    if not (
        (type(written) is int and 0 <= written < 2**53)
        or (type(written) is float and math.isfinite(written) and written >= 0)
    ):
        raise ManifestError(f"written: expected a non-negative Unix time, got {written!r:.40}")
    source = doc["source"]
    if source is not None and (not isinstance(source, str) or not 0 < len(source) <= 4096):
        raise ManifestError("source: expected a path of 1-4096 characters or null")
    return Record(
        name=rec_name,
        step=_int(doc, "step"),
        size=_int(doc, "size"),
        sha256=sha,
        written=float(written),
        source=source,
    )


class CheckpointPattern:
    """Which file names are checkpoints: the configured pattern (``step_{step}``) with any
    extension or none (``step_100.pt``, ``step_0100.safetensors``, ``step_100``). Only regular
    files are checkpoints; a directory of that name is ignored. ``<checkpoint>.part`` is a
    checkpoint being written."""

    def __init__(self, pattern: str = DEFAULT_CHECKPOINT_PATTERN) -> None:
        problem = checkpoint_pattern_problem(pattern)
        if problem:
            raise ValueError(f"checkpoint pattern: {problem}")
        self.pattern = pattern
        prefix, suffix = pattern.split("{step}")
        self._re = re.compile(
            rf"{re.escape(prefix)}([0-9]{{1,18}}){re.escape(suffix)}(?:\.[^/\\]*)?", re.ASCII
        )

    def step(self, name: str) -> int | None:
        """The step of a finished checkpoint's name, else None."""
        m = self._re.fullmatch(name)  # first: cheap, and rejects nearly every other name
        if m is None or name.endswith(PARTIAL_SUFFIX) or not is_plain_name(name):
            return None
        return int(m.group(1))

    def partial_step(self, name: str) -> int | None:
        """The step of a ``.part`` file being written under this pattern, else None."""
        if not name.endswith(PARTIAL_SUFFIX):
            return None
        return self.step(name[: -len(PARTIAL_SUFFIX)])


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
        fd = os.open(directory, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    except (PermissionError, IsADirectoryError):
        if os.name == "nt":
            return
        raise
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _manifest_dir(directory: Path, *, create: bool) -> Path:
    mdir = directory / MANIFEST_DIR
    try:
        st = os.lstat(mdir)
    except FileNotFoundError:
        if not create:
            raise
        with contextlib.suppress(FileExistsError):
            os.mkdir(mdir)
            fsync_dir(directory)
        st = os.lstat(mdir)
    if not stat.S_ISDIR(st.st_mode):
        raise ManifestError(f"{mdir} is not a directory (a link or a file)")
    return mdir


def record_path(directory: str | os.PathLike[str], name: str) -> Path:
    if not is_plain_name(name):
        raise ValueError(f"{name!r} is not a plain file name")
    return Path(directory) / MANIFEST_DIR / (name + RECORD_SUFFIX)


def write_record(directory: str | os.PathLike[str], record: Record) -> None:
    """Commit a record atomically: temporary file in the same directory, fsync, rename over the
    old record, fsync the directory. Killed at any point, the old record or the new one is
    there in full, never a mix."""
    final = record_path(directory, record.name)
    mdir = _manifest_dir(Path(directory), create=True)
    tmp = mdir / f".{record.name}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | FILE_FLAGS, 0o644)
    try:
        _write_all(fd, record.encode())
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, final)
    fsync_dir(mdir)


def remove_record(directory: str | os.PathLike[str], name: str) -> bool:
    """Remove a checkpoint's record (durably); False when there was none."""
    path = record_path(directory, name)
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    fsync_dir(path.parent)
    return True


def _read_capped(opener: Callable[[], int], what: str) -> bytes:
    fd = opener()
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ManifestError(f"{what} is not a regular file")
        if st.st_size > MAX_RECORD_BYTES:
            raise ManifestError(f"{what} is larger than {MAX_RECORD_BYTES} bytes")
        chunks = []
        left = MAX_RECORD_BYTES + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_record(directory: str | os.PathLike[str], name: str) -> Record | None:
    """The record of one checkpoint, None when it has none; ManifestError when it is bad."""
    path = record_path(directory, name)
    try:
        _manifest_dir(Path(directory), create=False)
        data = _read_capped(lambda: os.open(path, _RECORD_READ), str(path))
    except FileNotFoundError:
        return None
    except OSError as exc:
        if _is_link_error(exc):
            raise ManifestError(f"{path} is a symbolic link") from None
        raise
    try:
        return parse_record(data, name=name)
    except ManifestError as exc:
        raise ManifestError(f"{path}: {exc}") from None


def _is_link_error(exc: OSError) -> bool:
    """O_NOFOLLOW on a symbolic link fails with ELOOP (EMLINK on some BSDs)."""
    return exc.errno in (errno.ELOOP, errno.EMLINK)


RecordKey = tuple[int, int, int, int]

#: a directory whose stat stays the same is trusted to hold what it held once a full read has
#: confirmed it at least this long (by our own clock) after that stat was first seen: longer
#: than any filesystem's timestamp granularity (FAT's is 2 s), so that a change made within
#: the clock tick of the stat we saw, which leaves that stat as it was, has happened before the
#: confirming read. No file timestamp is compared with our clock, so skewed NFS clocks do not
#: matter.
SETTLE_SECONDS = 3.0
#: a trusted directory is read in full again at least this often all the same: a record edited
#: in place rather than replaced by a rename (which every trainguard writer does) changes no
#: directory stat, nor does a server clock stepped back into the same tick
REVALIDATE_SECONDS = 60.0


class DirectoryWatch:
    """Whether a directory may hold other entries than at its last full read. Creating,
    renaming or removing an entry changes the directory's mtime and ctime, so an unchanged stat
    means unchanged entries, once that stat has settled (see :data:`SETTLE_SECONDS`). What it
    says nothing about is the content of the entries themselves."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._key: tuple[int, ...] | None = None
        self._since = 0.0  # when the directory was first seen with _key
        self._checked_at = 0.0
        self._read_at = 0.0
        self._trusted = False  # a full read confirmed _key after it settled

    def unchanged(self, st: os.stat_result) -> bool:
        """True when the directory, with this stat now, holds what the last full read saw.
        When False, read it in full and then call :meth:`read_done`."""
        key = (st.st_dev, st.st_ino, st.st_size, st.st_nlink, st.st_mtime_ns, st.st_ctime_ns)
        now = self._checked_at = self._clock()
        if key != self._key:
            self._key, self._since, self._trusted = key, now, False
            return False
        if self._trusted and now - self._read_at < REVALIDATE_SECONDS:
            return True
        self._trusted = False
        return False

    def read_done(self) -> None:
        """A full read that started after the last :meth:`unchanged` succeeded."""
        self._read_at = self._checked_at
        self._trusted = self._checked_at - self._since >= SETTLE_SECONDS

    def forget(self) -> None:
        self._key, self._trusted = None, False


class RecordCache:
    """The records of one directory. Every writer commits a record by a rename into
    ``.trainguard/``, so while that directory is unchanged (:class:`DirectoryWatch`) its records
    are not listed again; otherwise only record files whose inode, size, mtime or ctime changed
    are re-read. The mapping returned is the same object for as long as the records are the
    same."""

    def __init__(self, directory: Path, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = directory
        self._cache: dict[str, tuple[RecordKey, Record]] = {}
        self._records: Mapping[str, Record] = {}
        self._watch = DirectoryWatch(clock)

    def read(self, dir_fd: int | None = None) -> Mapping[str, Record]:
        """All records of the directory (``dir_fd``: already opened, so that the records read
        are those of the directory the caller checked); ManifestError or OSError when any is
        unreadable, or when the directory itself is missing or not a directory."""
        mdir = self.directory / MANIFEST_DIR
        flags = os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC
        try:
            if dir_fd is None:
                if not stat.S_ISDIR(os.stat(self.directory).st_mode):
                    raise NotADirectoryError(
                        errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(self.directory)
                    )
                dfd = os.open(mdir, flags)
            else:
                dfd = os.open(MANIFEST_DIR, flags, dir_fd=dir_fd)
        except FileNotFoundError:
            self._cache.clear()
            self._watch.forget()
            if self._records:
                self._records = {}
            return self._records
        except OSError as exc:
            if _is_link_error(exc) or exc.errno == errno.ENOTDIR:
                raise ManifestError(f"{mdir} is not a directory (a link or a file)") from None
            raise
        try:
            if not self._watch.unchanged(os.fstat(dfd)):
                self._read_all(dfd, mdir)
                self._watch.read_done()
        finally:
            os.close(dfd)
        return self._records

    def _read_all(self, dfd: int, mdir: Path) -> None:
        fresh: dict[str, tuple[RecordKey, Record]] = {}
        reparsed = False
        try:
            for entry in _scandir(dfd, mdir):
                fname = entry.name
                if fname.startswith(".") or not fname.endswith(RECORD_SUFFIX):
                    continue  # temporaries of a writer (or of one that was killed)
                name = fname[: -len(RECORD_SUFFIX)]
                cached = self._cache.get(name)  # a cached name was checked when first read
                if cached is None and not is_plain_name(name):
                    raise ManifestError(f"{mdir / fname}: not a record of a plain file name")
                if len(fresh) >= MAX_RECORDS:
                    raise ManifestError(f"{mdir} holds more than {MAX_RECORDS} records")
                try:
                    st = entry.stat(follow_symlinks=False)
                    if not stat.S_ISREG(st.st_mode):
                        raise ManifestError(f"{mdir / fname} is not a regular file (a link?)")
                    key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                    if cached is not None and cached[0] == key:
                        fresh[name] = cached
                        continue
                    where = mdir / fname
                    data = _read_capped(_record_opener(dfd, mdir, fname), str(where))
                except FileNotFoundError:
                    continue  # pruned between listing and reading: it is gone
                try:
                    fresh[name] = (key, parse_record(data, name=name))
                except ManifestError as exc:
                    raise ManifestError(f"{where}: {exc}") from None
                reparsed = True
        except OSError as exc:
            if _is_link_error(exc):
                raise ManifestError(f"a record in {mdir} is a symbolic link") from None
            raise
        if reparsed or len(fresh) != len(self._cache):
            self._records = {name: rec for name, (_, rec) in fresh.items()}
        self._cache = fresh


def _record_opener(dfd: int, mdir: Path, fname: str) -> Callable[[], int]:
    """Open a record relative to the already-opened manifest directory where the platform can,
    so that a directory swapped for a link after the check cannot redirect the read."""
    if _DIR_FD:
        return lambda: os.open(fname, _RECORD_READ, dir_fd=dfd)
    return lambda: os.open(mdir / fname, _RECORD_READ)


def _scandir(dfd: int, path: Path) -> Iterator[os.DirEntry[Any]]:
    with os.scandir(dfd if _DIR_FD else path) as it:
        yield from it


class Entry(NamedTuple):
    """A checkpoint file (or ``.part``) found in a directory, with its lstat. (A named tuple:
    one is built per file per scrape, and a frozen dataclass costs several times more.)"""

    name: str
    step: int
    stat: os.stat_result


@dataclass(frozen=True)
class Listing:
    directory: Path
    files: tuple[Entry, ...]  # finished names, regular files
    partials: tuple[Entry, ...]  # ``.part`` files
    records: Mapping[str, Record]


#: name -> (step, is a .part) of the names that matched a pattern in the previous listing
StepMemo = dict[str, tuple[int, bool]]


def list_directory(
    directory: Path,
    pattern: CheckpointPattern,
    records: Mapping[str, Record],
    memo: StepMemo | None = None,
    *,
    dir_fd: int | None = None,
) -> Listing:
    """The checkpoints of a directory. Only names matching the pattern are stat'ed, so a
    directory of 100 000 unrelated entries costs one listing. A matching name that is a
    symbolic link, or a record naming anything but a regular file, is a ManifestError: links
    are never followed out of a checkpoint directory.

    ``memo`` (the same dict at every listing of this directory with this pattern) keeps the
    steps parsed from the names that matched last time; it is replaced by this listing's, so
    it only ever holds names that exist. ``dir_fd``, an open descriptor of ``directory``, is
    listed instead of the path."""
    files: list[Entry] = []
    partials: list[Entry] = []
    old = memo or {}
    seen: StepMemo = {}
    with os.scandir(directory if dir_fd is None else dir_fd) as it:
        for entry in it:
            name = entry.name
            known = old.get(name)
            if known is None:
                parsed = pattern.step(name)
                if parsed is None:
                    parsed = pattern.partial_step(name)
                    if parsed is None:
                        continue
                    known = (parsed, True)
                else:
                    known = (parsed, False)
            seen[name] = known
            step, partial = known
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # renamed or pruned since the listing (a .part just committed)
            if not _S_ISREG(st.st_mode):
                _not_regular(directory, name, st, records)
                continue
            (partials if partial else files).append(Entry(name, step, st))
    if memo is not None:
        memo.clear()
        memo.update(seen)
    return Listing(directory, tuple(files), tuple(partials), records)


_S_ISREG = stat.S_ISREG


def _not_regular(
    directory: Path, name: str, st: os.stat_result, records: Mapping[str, Record]
) -> None:
    """A checkpoint's name on something that is not a regular file: an error when it is a link
    or has a record, else (a directory named like a checkpoint) not a checkpoint at all."""
    if stat.S_ISLNK(st.st_mode):
        raise ManifestError(f"{directory / name} is a symbolic link; links are not followed")
    if name in records:
        raise ManifestError(f"record for {directory / name} names a non-regular file")


class CheckpointDirectory:
    """A checkpoint location as the exporter reads it at every scrape. While the directory is
    unchanged (:class:`DirectoryWatch`) the names that matched at the last full listing are the
    ones there, so each is stat'ed directly instead of listing the directory and parsing names
    again; each file is still stat'ed at every scrape, since a checkpoint overwritten in place
    changes no directory stat."""

    def __init__(
        self,
        directory: Path,
        pattern: CheckpointPattern,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self.pattern = pattern
        self._steps: StepMemo = {}
        self._watch = DirectoryWatch(clock)
        self._mounted_dev: int | None = None  # the device it was seen mounted from, if any

    def read(
        self, records: RecordCache, check: Callable[[os.stat_result], None] | None = None
    ) -> Listing:
        """The records (from ``records``, the cache of this directory) and checkpoints, all
        read through one open descriptor of the directory after ``check`` has seen its stat
        (and not raised): a directory swapped for another after the check is not read."""
        if not _DIR_FD:  # no openat (Windows): by path
            st = os.stat(self.directory)
            if check is not None:
                check(st)
            return list_directory(self.directory, self.pattern, records.read(), self._steps)
        fd = os.open(self.directory, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if check is not None:
                check(st)
            self._check_mounted(st, os.stat("..", dir_fd=fd))
            recs = records.read(dir_fd=fd)
            if self._watch.unchanged(st):
                listing = self._restat(fd, recs)
                if listing is not None:
                    return listing
                self._watch.forget()
            listing = list_directory(self.directory, self.pattern, recs, self._steps, dir_fd=fd)
            self._watch.read_done()
            return listing
        finally:
            os.close(fd)

    def _check_mounted(self, st: os.stat_result, parent: os.stat_result) -> None:
        """A location that is a volume's mount point shows, once the volume is unmounted, the
        empty directory underneath: "no checkpoints" where the truth is "cannot see them".
        Having seen it on another device than its parent, a later stat on its parent's device
        is an error, not an empty location."""
        if st.st_dev != parent.st_dev:
            self._mounted_dev = st.st_dev
        elif self._mounted_dev is not None:
            raise NotMounted(
                f"not mounted: the directory was a mount point (device {self._mounted_dev}) and "
                "is now on its parent's filesystem, so the checkpoints on that volume cannot be "
                "seen; mount it again (or restart the exporter if the volume is gone for good)"
            )

    def _restat(self, fd: int, records: Mapping[str, Record]) -> Listing | None:
        """The last listing's names, stat'ed afresh; None when one has gone (the directory
        changed after its stat was taken: list it)."""
        files: list[Entry] = []
        partials: list[Entry] = []
        lstat = os.stat
        for name, (step, partial) in self._steps.items():
            try:
                st = lstat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return None
            if not _S_ISREG(st.st_mode):
                _not_regular(self.directory, name, st, records)
                continue
            (partials if partial else files).append(Entry(name, step, st))
        return Listing(self.directory, tuple(files), tuple(partials), records)


def read_listing(directory: str | os.PathLike[str], pattern: CheckpointPattern) -> Listing:
    """Records and checkpoints of a directory, uncached (the library side)."""
    path = Path(directory)
    return list_directory(path, pattern, RecordCache(path).read())


class Judged(NamedTuple):
    """One checkpoint file judged against what its writer recorded (a named tuple, like
    :class:`Entry`)."""

    entry: Entry
    expected_size: int | None  # None: no record here nor on the primary
    expected_sha256: str | None
    mtime_known: bool
    settled: bool  # untouched for the grace period
    complete: bool  # size matches the expected size and the mtime is known
    truncated: bool  # smaller than expected and settled
    oversized: bool  # larger than expected and settled


def judge(
    listing: Listing,
    *,
    now_ns: int,
    grace_ns: int,
    primary: Listing | None = None,
    trust_unrecorded: bool = False,
) -> list[Judged]:
    """Judge every file of a location. Its own record gives the expected size and hash; a
    mirror's file without a record falls back on the primary's record of the same name, or on
    the primary file's size once that has settled. With ``trust_unrecorded``, a settled file
    for which none of these gives a size is complete (its writer recorded nothing to check)."""
    by_name = {e.name: e for e in primary.files} if primary is not None else {}
    out = []
    for entry in listing.files:
        rec = listing.records.get(entry.name)
        size: int | None = None
        sha: str | None = None
        if rec is not None:
            size, sha = rec.size, rec.sha256
        elif primary is not None:
            prec = primary.records.get(entry.name)
            if prec is not None:
                size, sha = prec.size, prec.sha256
            else:
                pfile = by_name.get(entry.name)
                if pfile is not None and settled(pfile.stat, now_ns, grace_ns):
                    size = pfile.stat.st_size
        st = entry.stat
        mtime = st.st_mtime_ns
        known = mtime > 0  # touched_ns() and settled(), inlined: this runs per file per scrape
        is_settled = known and now_ns - mtime >= grace_ns
        actual = st.st_size
        out.append(
            Judged(
                entry,
                size,
                sha,
                known,
                is_settled,
                known
                and (
                    actual == size
                    if size is not None
                    else trust_unrecorded and is_settled and actual > 0
                ),
                is_settled and size is not None and actual < size,
                is_settled and size is not None and actual > size,
            )
        )
    return out


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
