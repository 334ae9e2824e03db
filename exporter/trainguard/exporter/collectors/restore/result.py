"""The result a restore drill leaves in the state directory, and its strict reader.

``trainguard verify --restore`` writes one file per checked location
(``restore/<hint>-<sha8>.restore.json`` in the state directory, atomically); the exporter reads
every such file at each scrape and exports the restore-verified step and time. Whoever can
write the state directory can write one, so the reader takes nothing on trust: a bounded
read, every field checked by type and range, the field named in errors.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trainguard.shared import fields
from trainguard.shared.fileio import read_untrusted, replace_file
from trainguard.shared.heartbeat.record import MAX_PATH, MAX_TIME, check_run_name, kind_of
from trainguard.shared.statedir import state_file_stem

FORMAT = 1
SUFFIX = ".restore.json"
#: the results' directory under the state directory: the drill's own, so that reading them
#: never lists the heartbeats' directory again (the run table lists that once per scrape)
SUBDIR = "restore"


def results_dir(state_dir: Path) -> Path:
    """Where the drill writes its results and the exporter reads them."""
    return state_dir / SUBDIR


#: a result is a few hundred bytes; the reason is cut to MAX_REASON characters
MAX_BYTES = 64 * 1024
MAX_REASON = 2000
MAX_STEP = 2**63 - 1
MAX_NAME = 512
#: the same rule as mirror names in the config file
LOCATION_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


class ResultError(ValueError):
    """A result file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class Result:
    """One drill's outcome, with the last success carried over from the drills before it."""

    path: str  # the checkpoint directory the drill looked in (absolute)
    run: str | None  # --run; None: the exporter attributes it by path
    location: str | None  # --location; None: by path, else "primary"
    time: float  # when this check finished
    ok: bool  # this check loaded the checkpoint
    reason: str  # what failed, or the one-line summary
    checkpoint: str | None  # the checkpoint this check loaded (or tried to)
    step: int | None
    verified_step: int | None  # the newest step a check ever loaded (this one or an earlier)
    verified_time: float | None  # when that check finished
    verified_checkpoint: str | None

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self)}


def result_filename(path: str, run: str | None, location: str | None) -> str:
    """``<hint>-<sha8>.restore.json``: one file per (directory, run, location).

    The readable hint is only that (run names may hold anything); the hash keeps apart what
    sanitizes alike.
    """
    key = json.dumps([path, run, location])
    hint = run or os.path.basename(path.rstrip("/"))
    return f"{state_file_stem(hint, key, fallback='run')}{SUFFIX}"


def write_result(state_dir: Path, result: Result) -> Path:
    """Write (atomically replace) the result file of ``result`` in ``state_dir``; its path."""
    directory = results_dir(state_dir)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / result_filename(result.path, result.run, result.location)
    payload = json.dumps(result.to_json(), ensure_ascii=False, separators=(",", ":"))
    replace_file(target, payload.encode("utf-8"), fsync=True)
    return target


def read_result(path: str | os.PathLike[str], *, dir_fd: int | None = None) -> Result:
    """Read and check one result file; :class:`ResultError` names the file and the field.

    FileNotFoundError when it vanished.
    """
    from trainguard.shared.fileio import UntrustedFileError

    source = os.fspath(path)
    try:
        raw, _ = read_untrusted(source, MAX_BYTES, dir_fd=dir_fd)
    except UntrustedFileError as exc:
        raise ResultError(str(exc)) from None
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ResultError(f"{source}: not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ResultError(f"{source}: expected a JSON object, got {kind_of(doc)}")
    if problem := fields.integer(doc.get("format"), FORMAT, FORMAT):
        raise ResultError(f"{source}: field 'format': {problem}")
    doc_fields = _Fields(source, doc)
    run = doc_fields.opt_text("run", MAX_NAME)
    if run is not None and (problem := check_run_name(run)):
        raise ResultError(f"{source}: field 'run': {problem}")
    location = doc_fields.opt_text("location", 128)
    if location is not None and not LOCATION_RE.match(location):
        raise ResultError(f"{source}: field 'location': expected [A-Za-z0-9_.:-]{{1,128}}")
    result = Result(
        path=doc_fields.text("path", MAX_PATH),
        run=run,
        location=location,
        time=doc_fields.time("time"),
        ok=doc_fields.flag("ok"),
        reason=doc_fields.text("reason", MAX_REASON),
        checkpoint=doc_fields.opt_text("checkpoint", MAX_NAME),
        step=doc_fields.step("step"),
        verified_step=doc_fields.step("verified_step"),
        verified_time=doc_fields.opt_time("verified_time"),
        verified_checkpoint=doc_fields.opt_text("verified_checkpoint", MAX_NAME),
    )
    if (result.verified_step is None) != (result.verified_time is None):
        raise ResultError(f"{source}: fields 'verified_step' and 'verified_time': both or neither")
    if result.ok and result.verified_step is None:
        raise ResultError(f"{source}: field 'verified_step': null while 'ok' is true")
    return result


class _Fields(fields.Node):
    """A result document's fields, checked by :mod:`trainguard.shared.fields` (as heartbeats).

    Errors name the file and the field and never quote a string from the file.
    """

    __slots__ = ("source",)

    def __init__(self, source: str, doc: dict[str, Any]) -> None:
        super().__init__(doc)
        self.source = source

    def error(self, path: str, message: str) -> ResultError:
        return ResultError(f"{self.source}: field {path!r}: {message}")

    def _checked(self, name: str, problem: str | None) -> Any:
        self.check_at(name, problem)
        return self.raw.get(name)

    def opt_text(self, name: str, limit: int) -> str | None:
        return None if self.raw.get(name) is None else self.text(name, limit)

    def text(self, name: str, limit: int) -> str:
        value = self.raw.get(name)
        if name == "reason":  # a program's own words: line ends and tabs are kept
            return self._checked(name, fields.text(value, limit, raw=True))
        return self._checked(name, fields.text(value, limit))

    def flag(self, name: str) -> bool:
        return self._checked(name, fields.boolean(self.raw.get(name)))

    def opt_time(self, name: str) -> float | None:
        return None if self.raw.get(name) is None else self.time(name)

    def time(self, name: str) -> float:
        # 0 is no time a drill finished at (what a zeroed clock or file says)
        problem = fields.number(self.raw.get(name), _EPOCH, MAX_TIME, "seconds since the epoch")
        return float(self._checked(name, problem))

    def step(self, name: str) -> int | None:
        value = self.raw.get(name)
        return None if value is None else self._checked(name, fields.integer(value, 0, MAX_STEP))


#: the least time a result may hold: later than 0, which is an unknown time
_EPOCH = math.ulp(0.0)
