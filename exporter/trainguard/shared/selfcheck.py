"""The size a checkpoint file says it must have, read from its own format.

For files nobody recorded: a safetensors file (an 8-byte little-endian header length, a JSON header
whose ``data_offsets`` give the data's size), a zip (``torch.save``'s format since torch 1.6: the
end-of-central-directory record is the last thing written), a JSON document (it parses).

A framework that writes a directory in place (the Hugging Face Trainer without the trainguard
callback) leaves no record; these formats carry their own length, so a file cut short is told
from a whole one at once, with a few small reads, where otherwise only the grace period (nothing
touched for minutes) and no check at all of the content would judge it.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from trainguard.shared.fileio import FILE_FLAGS, O_CLOEXEC

#: the safetensors format caps its header at 100 MB
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
#: small JSON files are parsed whole (``config.json``, ``trainer_state.json``)
MAX_JSON_BYTES = 4 * 1024 * 1024
_ZIP_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".zip")
_EOCD = b"PK\x05\x06"
_EOCD64_LOCATOR = b"PK\x06\x07"
_EOCD64 = b"PK\x06\x06"
_TAIL = 22 + 65535  # the end record and the longest comment
#: (dev, inode, size, mtime, ctime) -> expected size; bounded, dropped whole when full
_CACHE: dict[tuple[int, ...], int | None] = {}
_CACHE_MAX = 100_000


def expected_size(path: Path, st: os.stat_result) -> int | None:
    """The size ``path`` (whose lstat is ``st``) must have by its own format, or None.

    None when its name or content carries none. A file shorter than its header claims gets that
    claim (or, for a zip whose end record is missing, the least it would need: 22 bytes more), so
    that it compares as truncated.
    """
    name = path.name
    kind = (
        "safetensors"
        if name.endswith(".safetensors")
        else "zip"
        if name.endswith(_ZIP_SUFFIXES)
        else "json"
        if name.endswith(".json") and st.st_size <= MAX_JSON_BYTES
        else None
    )
    if kind is None:
        return None
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key in _CACHE:
        return _CACHE[key]
    try:
        fd = os.open(path, os.O_RDONLY | FILE_FLAGS | O_CLOEXEC)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size != st.st_size:
            return None  # changing under us: judged again at the next look
        size = st.st_size
        if kind == "safetensors":
            got = _safetensors(fd, size)
        elif kind == "zip":
            got = _zip(fd, size)
        else:
            got = _json(fd, size)
    except (OSError, ValueError, struct.error):
        got = None
    finally:
        os.close(fd)
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.clear()
    _CACHE[key] = got
    return got


def indented_json_closed(fd: int, size: int) -> bool:
    r"""Whether a JSON object written with ``indent`` is whole, from two small reads.

    Such as the Hugging Face Trainer's ``trainer_state.json``: ``json.dumps(..., indent=2) + "\n"``.
    Only the top-level object closes at the start of a line, so a copy cut short anywhere does not
    end with ``\n}``. The whole document (megabytes of log history) is not parsed at every look.
    """
    if size < 3 or _read(fd, 0, 1) != b"{":
        return False
    end = _read(fd, max(0, size - 3), 3)
    return end.endswith(b"\n}") or end.endswith(b"\n}\n")


def _read(fd: int, offset: int, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = os.pread(fd, n - len(out), offset + len(out))
        if not chunk:
            break
        out += chunk
    return out


def _safetensors(fd: int, size: int) -> int | None:
    head = _read(fd, 0, 8)
    if len(head) < 8:
        return 8 if size < 8 else None
    (n,) = struct.unpack("<Q", head)
    if n < 2 or n > MAX_SAFETENSORS_HEADER:
        return None  # not a safetensors header
    if size < 8 + n:
        return 8 + n  # the header itself is cut short
    header = json.loads(_read(fd, 8, n))
    if not isinstance(header, dict):
        return None
    end = 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and o >= 0 for o in offsets)
        ):
            return None
        end = max(end, offsets[1])
    return 8 + n + end


def _zip(fd: int, size: int) -> int | None:
    if size < 4:
        return size + 22  # not even a format's magic: no torch.save writes so little
    if _read(fd, 0, 4) != b"PK\x03\x04":
        return None  # not a zip (torch's legacy format, or anything else): no claim
    start = max(0, size - _TAIL)
    tail = _read(fd, start, size - start)
    at = tail.rfind(_EOCD)
    while at >= 0:
        if _eocd_consistent(fd, tail, at, start + at, size):
            return size
        at = tail.rfind(_EOCD, 0, at)
    return size + 22  # no end record: written only at the end, so the file is cut short


def _eocd_consistent(fd: int, tail: bytes, at: int, pos: int, size: int) -> bool:
    """Whether the end record at ``pos`` ends the file and follows the central directory.

    The central directory must end where the end records start (the zip64 one, which torch
    always writes, or this one).
    """
    if at + 22 > len(tail):
        return False
    cd_size, cd_offset, comment = struct.unpack("<IIH", tail[at + 12 : at + 22])
    if pos + 22 + comment != size:
        return False
    loc = _read(fd, pos - 20, 20) if pos >= 20 else b""
    if len(loc) == 20 and loc[:4] == _EOCD64_LOCATOR:
        (rec_pos,) = struct.unpack("<Q", loc[8:16])
        rec = _read(fd, rec_pos, 56)
        if len(rec) != 56 or rec[:4] != _EOCD64:
            return False
        cd64_size, cd64_offset = struct.unpack("<QQ", rec[40:56])
        return bool(cd64_offset + cd64_size == rec_pos)
    if 0xFFFFFFFF in (cd_size, cd_offset):
        return False  # zip64 sizes without their record
    return bool(cd_offset + cd_size == pos)


def _json(fd: int, size: int) -> int | None:
    if indented_json_closed(fd, size):
        return size
    json.loads(_read(fd, 0, size))  # ValueError when cut short: no claim either way
    return size
