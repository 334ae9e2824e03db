"""Save status files: how the saves into one checkpoint directory went, for the exporter.

The checkpoint library (:mod:`trainguard.checkpoint`) runs inside the training script and
knows no :class:`trainguard.Run`; the exporter knows the run's checkpoint locations. They meet
in the state directory (the heartbeats' directory, :mod:`trainguard.shared.statedir`): one
small JSON file per checkpoint directory, ``<state dir>/saves/<name>-<hash>.json``, named by
the directory's absolute path, holding the failed saves counted by reason and the times of the
last success and the last failure. Why there and not beside the checkpoints: a save that failed
because that disk is full or read-only could not record it on the same disk, and the state
directory is usually elsewhere (and if it is full too, the run's heartbeats stop and that pages
on its own).

This is the one definition the writer (:mod:`trainguard.checkpoint.outcomes`) and the reader
(:mod:`trainguard.exporter.collectors.checkpoints.saves`) share. The file is untrusted input for the
exporter: read with a size cap, exact keys and types, and the directory it names must be the
location's.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.shared.statedir import state_file_stem

#: the subdirectory of the state directory holding the status files
SAVES_DIR = "saves"
FORMAT = 1
#: a real file is ~250 bytes
MAX_BYTES = 8 * 1024
#: why a save failed, from the errno of the OSError behind it (``other``: anything else)
REASONS = ("enospc", "edquot", "eio", "erofs", "other")
MAX_COUNT = 2**63 - 1
MAX_TIME = 1e11
_KEYS = frozenset({"format", "directory", "failures", "last_success", "last_failure"})


class SaveStatusError(ValueError):
    """A status file that cannot be used; the message names the field."""


@dataclass(frozen=True)
class SaveStatus:
    """The saves into one checkpoint directory, across every process that saved there."""

    directory: str  # absolute path of the checkpoint directory (a location)
    failures: dict[str, int] = field(default_factory=dict)  # reason -> failed saves
    last_success: float | None = None  # Unix time the last save completed
    last_failure: float | None = None  # Unix time the last save failed

    def encode(self) -> bytes:
        doc = {
            "format": FORMAT,
            "directory": self.directory,
            "failures": {r: self.failures[r] for r in REASONS if self.failures.get(r)},
            "last_success": self.last_success,
            "last_failure": self.last_failure,
        }
        return json.dumps(doc, sort_keys=True, allow_nan=False).encode()


def location_key(directory: str | os.PathLike[str]) -> str:
    """How a checkpoint directory is named on both sides: its absolute, normalised path."""
    return os.path.abspath(os.fspath(directory))


def status_path(state_dir: str | os.PathLike[str], directory: str | os.PathLike[str]) -> Path:
    """The status file of ``directory`` in ``state_dir``.

    ``<last component>-<16 hex of SHA-256 of the absolute path>.json``: the readable part is a
    hint, the hash keeps directories of the same last name apart.
    """
    key = location_key(directory)
    stem = state_file_stem(os.path.basename(key), key, fallback="root", digits=16)
    return Path(state_dir) / SAVES_DIR / f"{stem}.json"


def _time(doc: dict[str, Any], key: str) -> float | None:
    value = doc[key]
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (math.isfinite(value) and 0 <= value <= MAX_TIME)
    ):
        raise SaveStatusError(f"{key}: expected seconds since the epoch or null")
    return float(value)


def parse_status(data: bytes) -> SaveStatus:
    """Parse a status file; anything but a well-formed one raises SaveStatusError."""
    if len(data) > MAX_BYTES:
        raise SaveStatusError(f"larger than {MAX_BYTES} bytes")
    try:
        doc = json.loads(data.decode("utf-8"), parse_constant=_reject)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise SaveStatusError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict) or set(doc) != _KEYS:
        raise SaveStatusError(f"expected an object with the keys {sorted(_KEYS)}")
    if doc["format"] != FORMAT or type(doc["format"]) is not int:
        raise SaveStatusError("format: unsupported")
    directory = doc["directory"]
    if not isinstance(directory, str) or not 0 < len(directory) <= 4096:
        raise SaveStatusError("directory: expected a path of 1-4096 characters")
    failures = doc["failures"]
    if not isinstance(failures, dict):
        raise SaveStatusError("failures: expected an object")
    for reason, count in failures.items():
        if reason not in REASONS:
            raise SaveStatusError(f"failures: {reason[:32]!r} is not a reason")
        if type(count) is not int or not 0 <= count <= MAX_COUNT:
            raise SaveStatusError(f"failures.{reason}: expected an integer >= 0")
    return SaveStatus(
        directory=directory,
        failures=dict(failures),
        last_success=_time(doc, "last_success"),
        last_failure=_time(doc, "last_failure"),
    )


def _reject(value: str) -> Any:
    raise ValueError(f"{value} is not a number")
