"""Manifest records as they lie on disk, shared by the library and the exporter.

This is the one definition that the library writing them (:mod:`trainguard.checkpoint`) and the
exporter judging them (:mod:`trainguard.exporter.collectors.checkpoints.collector`) share, so the
two never disagree on what a checkpoint should hold.

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
import json
import math
import os
import re
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.shared.fileio import (
    FILE_FLAGS,
    O_CLOEXEC,
    O_DIRECTORY,
    O_NOFOLLOW,
    UntrustedFileError,
    fsync_dir,
    is_not_a_dir_error,
    read_untrusted,
    scandir_fd,
    write_all,
)
from trainguard.shared.pattern import is_plain_name

MANIFEST_DIR = ".trainguard"
RECORD_SUFFIX = ".json"
RECORD_VERSION = 1
#: a directory checkpoint's record lists every file under it
DIR_RECORD_VERSION = 2
#: a record is ~300 bytes; the cap leaves room for a long ``source`` path and nothing more
MAX_RECORD_BYTES = 16 * 1024
#: a directory's record (one line per file, ~150 bytes each) may be larger, up to this; it is
#: written with its keys sorted, so it starts with ``{"files": [``
MAX_DIR_RECORD_BYTES = 16 * 1024 * 1024
MAX_DIR_RECORD_FILES = 100_000
_DIR_RECORD_START = b'{"files": ['
#: more records than this in one directory is not a checkpoint directory we can judge cheaply
MAX_RECORDS = 100_000
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_RECORD_KEYS = frozenset({"version", "name", "step", "size", "sha256", "written", "source"})
_DIR_RECORD_KEYS = _RECORD_KEYS | {"files"}
#: optional: absent in records of writers that knew no loss (and of older trainguard)
_OPTIONAL_KEYS = frozenset({"loss_finite"})
_MAX_INT = 2**63 - 1


class ManifestError(Exception):
    """A manifest record or checkpoint directory entry that cannot be trusted.

    It is malformed, too big, a link, or naming something outside its directory.
    """


@dataclass(frozen=True)
class Record:
    """What the writer knew when it committed a checkpoint."""

    name: str  # plain file name of the checkpoint, in the record's own directory
    step: int
    size: int  # bytes the file must have; for a mirror, the primary's expected size
    sha256: str | None  # lowercase hex of the content, None when the writer had none
    written: float  # Unix time of the commit
    source: str | None = None  # for a mirror: the file it was copied from
    #: for a directory checkpoint: every regular file under it, (path relative to the
    #: directory, size, SHA-256 or None), sorted by path; ``size`` is then their total and
    #: ``sha256`` None. None for a single-file checkpoint.
    files: tuple[tuple[str, int, str | None], ...] | None = None
    #: whether the saving process's loss was finite when it saved (trainguard.Run's last
    #: reported loss); None when unknown: no run in that process, no loss reported yet
    loss_finite: bool | None = None

    def encode(self) -> bytes:
        doc: dict[str, Any] = {
            "version": RECORD_VERSION,
            "name": self.name,
            "step": self.step,
            "size": self.size,
            "sha256": self.sha256,
            "written": self.written,
            "source": self.source,
        }
        if self.loss_finite is not None:
            doc["loss_finite"] = self.loss_finite
        if self.files is not None:
            doc["version"] = DIR_RECORD_VERSION
            doc["files"] = [list(f) for f in self.files]
        return json.dumps(doc, sort_keys=True, allow_nan=False).encode()

    def file_map(self) -> dict[str, tuple[int, str | None]]:
        """A directory record's files: relative path -> (size, SHA-256)."""
        return {path: (size, sha) for path, size, sha in self.files or ()}


def is_relative_path(path: str) -> bool:
    """Whether ``path`` can only name something under the directory it is relative to.

    That is: '/' separated, no empty, '.' or '..' component, no control characters (hidden names
    are fine: DCP's ``.metadata``).
    """
    if not 0 < len(path) <= 4096 or path.startswith("/") or "\\" in path:
        return False
    for part in path.split("/"):
        if part in ("", ".", "..") or len(part) > 255 or _CONTROL.search(part):
            return False
    return True


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

    Anything but a well-formed record about exactly that plain name raises ManifestError.
    """
    if len(data) > MAX_RECORD_BYTES and (
        len(data) > MAX_DIR_RECORD_BYTES or not data.startswith(_DIR_RECORD_START)
    ):
        raise ManifestError(f"larger than {MAX_RECORD_BYTES} bytes (not a directory's record)")
    try:
        doc = json.loads(
            data.decode("utf-8"), object_pairs_hook=_pairs, parse_constant=_reject_constant
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ManifestError(f"not a JSON record: {exc}") from None
    if not isinstance(doc, dict):
        raise ManifestError("not a JSON object")
    keys = _DIR_RECORD_KEYS if "files" in doc else _RECORD_KEYS
    if set(doc) - _OPTIONAL_KEYS != keys:
        missing = sorted(keys - set(doc))
        extra = sorted(set(doc) - keys - _OPTIONAL_KEYS)
        raise ManifestError(f"unexpected keys (missing {missing}, unknown {extra})")
    version = DIR_RECORD_VERSION if "files" in doc else RECORD_VERSION
    if doc["version"] != version or type(doc["version"]) is not int:
        raise ManifestError(f"unsupported version {doc['version']!r:.40}")
    if len(data) > MAX_RECORD_BYTES and "files" not in doc:
        raise ManifestError(f"larger than {MAX_RECORD_BYTES} bytes")
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
    loss_finite = doc.get("loss_finite")
    if loss_finite is not None and not isinstance(loss_finite, bool):
        raise ManifestError(f"loss_finite: expected true, false or null, got {loss_finite!r:.40}")
    return Record(
        name=rec_name,
        step=_int(doc, "step"),
        size=_int(doc, "size"),
        sha256=sha,
        written=float(written),
        source=source,
        files=_files(doc["files"]) if "files" in doc else None,
        loss_finite=loss_finite,
    )


def _files(value: Any) -> tuple[tuple[str, int, str | None], ...]:
    """A directory record's file list: [[path, size, sha256 or null], ...], sorted, unique."""
    if not isinstance(value, list) or len(value) > MAX_DIR_RECORD_FILES:
        raise ManifestError(f"files: expected a list of at most {MAX_DIR_RECORD_FILES} entries")
    out: list[tuple[str, int, str | None]] = []
    for item in value:
        if not isinstance(item, list) or len(item) != 3:
            raise ManifestError("files: expected [path, size, sha256] entries")
        path, size, sha = item
        if not isinstance(path, str) or not is_relative_path(path):
            raise ManifestError(f"files: {path!r:.80} is not a path inside the directory")
        if type(size) is not int or not 0 <= size <= _MAX_INT:
            raise ManifestError(f"files: size of {path!r:.80}: expected an integer")
        if sha is not None and (not isinstance(sha, str) or not _SHA256_RE.fullmatch(sha)):
            raise ManifestError(f"files: sha256 of {path!r:.80}: expected 64 hex digits or null")
        if out and path <= out[-1][0]:
            raise ManifestError("files: expected paths sorted and unique")
        out.append((path, size, sha))
    return tuple(out)


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
    """Commit a record atomically: never a mix of the old record and the new one.

    Temporary file in the same directory, fsync, rename over the old record, fsync the directory.
    Killed at any point, the old record or the new one is there in full.
    """
    final = record_path(directory, record.name)
    mdir = _manifest_dir(Path(directory), create=True)
    tmp = mdir / f".{record.name}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | FILE_FLAGS, 0o644)
    try:
        write_all(fd, record.encode())
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


def _read(path: Path, dir_fd: int | None = None) -> bytes:
    """A record's bytes, read as every untrusted file is; FileNotFoundError when it is gone."""
    try:
        return read_untrusted(path, MAX_DIR_RECORD_BYTES, dir_fd=dir_fd)[0]
    except UntrustedFileError as exc:
        raise ManifestError(str(exc)) from None


def read_record(directory: str | os.PathLike[str], name: str) -> Record | None:
    """The record of one checkpoint, None when it has none; ManifestError when it is bad."""
    path = record_path(directory, name)
    try:
        _manifest_dir(Path(directory), create=False)
        data = _read(path)
    except FileNotFoundError:
        return None
    try:
        return parse_record(data, name=name)
    except ManifestError as exc:
        raise ManifestError(f"{path}: {exc}") from None


RecordKey = tuple[int, int, int, int]


def read_records(
    dfd: int, mdir: Path, previous: Mapping[str, tuple[RecordKey, Record]] | None = None
) -> dict[str, tuple[RecordKey, Record]]:
    """Every record of the open manifest directory ``dfd`` (at ``mdir``), with its key.

    The key is the (inode, size, mtime, ctime) it was read under. A record whose key is the same
    as in ``previous`` is taken from there rather than read and parsed again. ManifestError or
    OSError when any record is unreadable.
    """
    old = previous or {}
    fresh: dict[str, tuple[RecordKey, Record]] = {}
    for entry in scandir_fd(dfd, mdir):
        fname = entry.name
        if fname.startswith(".") or not fname.endswith(RECORD_SUFFIX):
            continue  # temporaries of a writer (or of one that was killed)
        name = fname[: -len(RECORD_SUFFIX)]
        cached = old.get(name)  # a cached name was checked when first read
        if cached is None and not is_plain_name(name):
            raise ManifestError(f"{mdir / fname}: not a record of a plain file name")
        if len(fresh) >= MAX_RECORDS:
            raise ManifestError(f"{mdir} holds more than {MAX_RECORDS} records")
        try:
            st = entry.stat(follow_symlinks=False)
            key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if cached is not None and cached[0] == key:
                fresh[name] = cached
                continue
            where = mdir / fname
            data = _read(where, dfd)
        except FileNotFoundError:
            continue  # pruned between listing and reading: it is gone
        try:
            fresh[name] = (key, parse_record(data, name=name))
        except ManifestError as exc:
            raise ManifestError(f"{where}: {exc}") from None
    return fresh


def open_manifest_dir(directory: Path, dir_fd: int | None = None) -> int | None:
    """Open ``directory``'s manifest directory without following a link; None when it has none.

    It is opened relative to ``dir_fd``, the directory already opened, where given. ManifestError
    when it is a link or a file; OSError when ``directory`` itself is missing or not a directory.
    """
    mdir = directory / MANIFEST_DIR
    flags = os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC
    try:
        if dir_fd is None:
            if not stat.S_ISDIR(os.stat(directory).st_mode):
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(directory))
            return os.open(mdir, flags)
        return os.open(MANIFEST_DIR, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if is_not_a_dir_error(exc):
            raise ManifestError(f"{mdir} is not a directory (a link or a file)") from None
        raise


def read_all_records(directory: str | os.PathLike[str]) -> dict[str, Record]:
    """Every record of a checkpoint directory, uncached (the library side)."""
    path = Path(directory)
    dfd = open_manifest_dir(path)
    if dfd is None:
        return {}
    try:
        return {name: rec for name, (_, rec) in read_records(dfd, path / MANIFEST_DIR).items()}
    finally:
        os.close(dfd)
