"""The hash verifier's verdicts kept across exporter restarts.

Without it a restarted exporter knows nothing of what it hashed: a checkpoint it had found
corrupt reads ``hash_mismatch_files 0`` (and ``pending``) for the tens of minutes it takes to
hash a large run again, and CheckpointHashMismatch resolves, then pages again. With it the
verdict of a file whose identity (device, inode, size, mtime and ctime) and recorded hash are
unchanged is known at the first scrape after the restart.

The file is the exporter's own (``checkpoints.verify_cache`` in the config file, by default
in the per-user cache directory), never the state directory that training processes of other
users may write: a verdict file someone else could write would let them hide a corrupt
checkpoint. It is read only when this process's user owns it and nobody else can write it, and
every entry is checked; anything wrong is logged once and the verdicts are hashed again.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trainguard.shared.fileio import UntrustedFileError, read_untrusted, replace_file

log = logging.getLogger(__name__)

FORMAT = 1
#: a verdict is ~200 bytes: room for about 150,000 files
MAX_BYTES = 32 << 20
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_STATUSES = ("match", "mismatch")

#: (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns), as :func:`verifier.file_key`
FileKey = tuple[int, int, int, int, int]
#: ((file key, expected SHA-256), status, path)
Verdict = tuple[tuple[FileKey, str], str, str]


class VerdictCache:
    """Loads and saves the verdicts; each kind of failure is logged once, never raised."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._warned: set[str] = set()

    def _warn(self, kind: str, message: str, *args: Any) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(message, *args)

    def load(self) -> list[Verdict]:
        """The verdicts saved last; none when there is no file or it cannot be trusted."""
        try:
            data, st = read_untrusted(self.path, MAX_BYTES)
        except FileNotFoundError:
            return []
        except (UntrustedFileError, OSError) as exc:
            self._warn("read", "verified-checkpoint cache not used (hashing again): %s", exc)
            return []
        if hasattr(os, "geteuid") and (st.st_uid != os.geteuid() or st.st_mode & 0o022):
            self._warn(
                "owner",
                "verified-checkpoint cache %s not used (hashing again): it must belong to this "
                "user (uid %d, it is %d) and be writable by nobody else (mode %o)",
                self.path,
                os.geteuid(),
                st.st_uid,
                st.st_mode & 0o777,
            )
            return []
        try:
            return _parse(data)
        except ValueError as exc:
            self._warn("parse", "verified-checkpoint cache %s not used: %s", self.path, exc)
            return []

    def save(self, verdicts: Iterable[Verdict]) -> None:
        """Replace the file with these verdicts (a failure, such as a read-only disk, is logged)."""
        rows = [[*key, sha, status, path] for (key, sha), status, path in verdicts]
        payload = json.dumps({"format": FORMAT, "verdicts": rows}, separators=(",", ":"))
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            replace_file(self.path, payload.encode(), 0o600)
        except OSError as exc:
            self._warn(
                "write",
                "cannot save the hash verdicts to %s (%s): a restarted exporter will hash every "
                "checkpoint again, and a corrupt one reads as pending meanwhile; set "
                "checkpoints.verify_cache to a writable file",
                self.path,
                exc.strerror or exc,
            )


def _parse(data: bytes) -> list[Verdict]:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"expected an object with format {FORMAT}")
    rows = doc.get("verdicts")
    if not isinstance(rows, list):
        raise ValueError("field 'verdicts': expected a list")
    out: list[Verdict] = []
    for i, row in enumerate(rows):
        ok = (
            isinstance(row, list)
            and len(row) == 8
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in row[:5])
            and isinstance(row[5], str)
            and _SHA256.fullmatch(row[5]) is not None
            and row[6] in _STATUSES
            and isinstance(row[7], str)
            and 0 < len(row[7]) <= 4096
        )
        if not ok:
            raise ValueError(
                f"field 'verdicts[{i}]': expected [dev, ino, size, mtime_ns, ctime_ns, "
                "sha256, 'match'|'mismatch', path]"
            )
        key: FileKey = (row[0], row[1], row[2], row[3], row[4])
        out.append(((key, row[5]), row[6], row[7]))
    return out
