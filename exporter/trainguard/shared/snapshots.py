"""CUDA memory snapshot files and requests for one: the names and formats both sides agree on.

The request asks a live run for a snapshot. The training side (``trainguard.run.snapshots.capture``)
writes snapshots, their metadata and replies; the ``trainguard snapshot`` command writes a
request and waits for the reply. Stdlib only, like the rest of ``trainguard.shared``.

Files, all in the state directory next to the run's heartbeat (``<stem>`` is the heartbeat's
name without ``.heartbeat.json``):

- ``<stem>.<reason>-<n>.pickle``: a snapshot as ``torch.cuda.memory._dump_snapshot`` writes it
  (open it at https://pytorch.org/memory_viz); reason ``oom``, ``periodic`` or ``requested``;
  ``n`` counts that reason's snapshots of the run and rank, carried across restarts.
- ``<stem>.<reason>-<n>.json``: its metadata (:data:`META_FORMAT`).
- ``<stem>.oom-<n>.before.pickle`` / ``<stem>.died-<n>.before.pickle`` (and ``.json``): the
  newest periodic snapshot, renamed at OOM snapshot ``n`` or when the restarted run found death
  ``n`` so that rotation never deletes the one from before the failure.
- ``<stem>.snapshot-request.json``: a request (:class:`Request`), removed once read.
- ``<stem>.snapshot-reply.json``: the reply to the last request (:class:`Reply`).

Request and reply files are read as untrusted input (another user may be able to write the
state directory): no symbolic links, regular files only, at most :data:`MAX_REQUEST_BYTES`,
every field checked, and every failure a :class:`SnapshotFileError`.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from dataclasses import dataclass
from typing import Any

from trainguard.shared.fileio import UntrustedFileError, read_untrusted, replace_file
from trainguard.shared.heartbeat.record import SNAPSHOT_REASONS, SUFFIX, heartbeat_filename

REASONS = SNAPSHOT_REASONS
#: reasons whose files rotate (the newest ``keep`` are kept); OOM snapshots are bounded per
#: process instead, and ``.before`` files are never deleted by trainguard
ROTATING = ("periodic", "requested")
REQUEST_SUFFIX = ".snapshot-request.json"
REPLY_SUFFIX = ".snapshot-reply.json"
REQUEST_FORMAT = 1
META_FORMAT = 1
MAX_REQUEST_BYTES = 4096
MAX_ERROR = 500

_NAME_RE = re.compile(
    r"^(?P<stem>.+)\.(?P<reason>oom|periodic|requested|died)-(?P<number>[1-9][0-9]{0,17})"
    r"(?P<before>\.before)?\.(?P<ext>pickle|json)$"
)
_ID_RE = re.compile(r"^[0-9a-f]{32}$")


class SnapshotFileError(ValueError):
    """A request or reply file that cannot be used; the message names the file."""


def run_stem(run: str, rank: int) -> str:
    """The heartbeat's file name without ``.heartbeat.json``.

    Every file of a run and rank starts with it.
    """
    return heartbeat_filename(run, rank)[: -len(SUFFIX)]


def snapshot_name(stem: str, reason: str, number: int, *, before: bool = False) -> str:
    """``<stem>.<reason>-<n>[.before].pickle``."""
    return f"{stem}.{reason}-{number}{'.before' if before else ''}.pickle"


def metadata_name(snapshot: str) -> str:
    """The metadata file of a snapshot file name: ``.pickle`` replaced by ``.json``."""
    return snapshot[: -len(".pickle")] + ".json"


@dataclass(frozen=True)
class SnapshotName:
    reason: str  # oom, periodic, requested, or died (a .before file only)
    number: int
    before: bool
    ext: str  # pickle or json


def parse_snapshot_name(name: str, stem: str) -> SnapshotName | None:
    """What a file name of ``stem``'s says, or None when it is not a snapshot file of it."""
    m = _NAME_RE.match(name)
    if m is None or m.group("stem") != stem:
        return None
    before = m.group("before") is not None
    if m.group("reason") == "died" and not before:
        return None
    return SnapshotName(m.group("reason"), int(m.group("number")), before, m.group("ext"))


# ------------------------------------------------------------------------- request, reply


@dataclass(frozen=True)
class Request:
    """``trainguard snapshot RUN`` asks for one snapshot now."""

    id: str  # 32 hex digits, echoed in the reply
    time: float  # when it was asked, seconds since the epoch
    requester: str  # who asked (user@host pid N), for the run's log; at most 200 characters

    @classmethod
    def new(cls, requester: str, now: float) -> Request:
        return cls(secrets.token_hex(16), now, requester[:200])

    def to_dict(self) -> dict[str, Any]:
        return {"format": REQUEST_FORMAT, "id": self.id, "time": self.time, "by": self.requester}


@dataclass(frozen=True)
class Reply:
    """What the run did with request ``id``: the ``file`` written, or an ``error`` saying why not.

    ``file`` is a name in the state directory.
    """

    id: str
    time: float
    ok: bool
    file: str | None = None
    step: int | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": REQUEST_FORMAT,
            "id": self.id,
            "time": self.time,
            "ok": self.ok,
            "file": self.file,
            "step": self.step,
            "error": None if self.error is None else self.error[:MAX_ERROR],
        }


def write_json(path: str | os.PathLike[str], doc: Any, mode: int = 0o644) -> None:
    """Replace ``path`` atomically with ``doc`` as JSON.

    It goes through a temp file created exclusively (a planted symlink is never followed),
    written, then ``os.replace``d.
    """
    payload = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    replace_file(path, payload, mode)


def read_request_or_reply(path: str | os.PathLike[str]) -> tuple[bytes, os.stat_result]:
    """The bytes of a request or reply and its stat, read as every untrusted file is.

    FileNotFoundError when it is not there, :class:`SnapshotFileError` for anything else
    wrong with it.
    """
    try:
        return read_untrusted(path, MAX_REQUEST_BYTES)
    except UntrustedFileError as exc:
        raise SnapshotFileError(str(exc)) from None


def _document(source: str, data: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise SnapshotFileError(f"{source}: not JSON") from None
    if not isinstance(doc, dict):
        raise SnapshotFileError(f"{source}: expected a JSON object")
    if doc.get("format") != REQUEST_FORMAT or isinstance(doc.get("format"), bool):
        raise SnapshotFileError(f"{source}: unsupported format (expected {REQUEST_FORMAT})")
    ident = doc.get("id")
    if not isinstance(ident, str) or not _ID_RE.match(ident):
        raise SnapshotFileError(f"{source}: field 'id': expected 32 hex digits")
    when = doc.get("time")
    if isinstance(when, bool) or not isinstance(when, (int, float)) or not 0 <= when <= 1e11:
        raise SnapshotFileError(f"{source}: field 'time': expected seconds since the epoch")
    return doc


def parse_request(data: bytes, source: str = "<request>") -> Request:
    doc = _document(source, data)
    by = doc.get("by", "")
    if not isinstance(by, str) or len(by) > 200 or not by.isprintable():
        raise SnapshotFileError(f"{source}: field 'by': expected printable text, at most 200")
    return Request(doc["id"], float(doc["time"]), by)


def parse_reply(data: bytes, source: str = "<reply>") -> Reply:
    doc = _document(source, data)
    ok = doc.get("ok")
    if not isinstance(ok, bool):
        raise SnapshotFileError(f"{source}: field 'ok': expected true or false")
    file = doc.get("file")
    if file is not None and (
        not isinstance(file, str) or "/" in file or "\\" in file or file in ("", ".", "..")
    ):
        raise SnapshotFileError(f"{source}: field 'file': expected a file name")
    step = doc.get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise SnapshotFileError(f"{source}: field 'step': expected an integer >= 0")
    error = doc.get("error")
    if error is not None and (not isinstance(error, str) or len(error) > MAX_ERROR):
        raise SnapshotFileError(f"{source}: field 'error': expected text")
    return Reply(doc["id"], float(doc["time"]), ok, file, step, error)
