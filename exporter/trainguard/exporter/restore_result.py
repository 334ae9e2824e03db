"""The result a restore drill leaves in the state directory, and its strict reader.

``trainguard verify --restore`` writes one file per checked location
(``restore/<hint>-<sha8>.restore.json`` in the state directory, atomically); the exporter reads
every such file at each scrape and exports the restore-verified step and time. Whoever can
write the state directory can write one, so the reader takes nothing on trust: a bounded
read, every field checked by type and range, the field named in errors.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trainguard.shared.fileio import read_untrusted, replace_file
from trainguard.shared.heartbeat import MAX_PATH, MAX_TIME, check_run_name, kind_of, text_problem

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
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


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
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:8]
    hint = _UNSAFE.sub("_", run or os.path.basename(path.rstrip("/")))[:48].strip("_") or "run"
    return f"{hint}-{digest}{SUFFIX}"


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
    if doc.get("format") != FORMAT:
        raise ResultError(f"{source}: field 'format': expected {FORMAT}, got {doc.get('format')!r}")
    fields = _Fields(source, doc)
    run = fields.opt_text("run", MAX_NAME)
    if run is not None and (problem := check_run_name(run)):
        raise ResultError(f"{source}: field 'run': {problem}")
    location = fields.opt_text("location", 128)
    if location is not None and not LOCATION_RE.match(location):
        raise ResultError(f"{source}: field 'location': expected [A-Za-z0-9_.:-]{{1,128}}")
    result = Result(
        path=fields.text("path", MAX_PATH),
        run=run,
        location=location,
        time=fields.time("time"),
        ok=fields.flag("ok"),
        reason=fields.text("reason", MAX_REASON),
        checkpoint=fields.opt_text("checkpoint", MAX_NAME),
        step=fields.step("step"),
        verified_step=fields.step("verified_step"),
        verified_time=fields.opt_time("verified_time"),
        verified_checkpoint=fields.opt_text("verified_checkpoint", MAX_NAME),
    )
    if (result.verified_step is None) != (result.verified_time is None):
        raise ResultError(f"{source}: fields 'verified_step' and 'verified_time': both or neither")
    if result.ok and result.verified_step is None:
        raise ResultError(f"{source}: field 'verified_step': null while 'ok' is true")
    return result


class _Fields:
    """Typed, range-checked access to a result document's fields, naming the field in errors."""

    def __init__(self, source: str, doc: dict[str, Any]) -> None:
        self.source = source
        self.doc = doc

    def _fail(self, name: str, why: str) -> ResultError:
        return ResultError(f"{self.source}: field {name!r}: {why}")

    def opt_text(self, name: str, limit: int) -> str | None:
        return None if self.doc.get(name) is None else self.text(name, limit)

    def text(self, name: str, limit: int) -> str:
        value = self.doc.get(name)
        if not isinstance(value, str):
            raise self._fail(name, f"expected a string, got {kind_of(value)}")
        if len(value) > limit:
            raise self._fail(name, f"longer than {limit} characters")
        problem = text_problem(value) if name != "reason" else None
        if problem:
            raise self._fail(name, problem)
        return value

    def flag(self, name: str) -> bool:
        value = self.doc.get(name)
        if not isinstance(value, bool):
            raise self._fail(name, f"expected true or false, got {kind_of(value)}")
        return value

    def opt_time(self, name: str) -> float | None:
        return None if self.doc.get(name) is None else self.time(name)

    def time(self, name: str) -> float:
        value = self.doc.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._fail(name, f"expected seconds since the epoch, got {kind_of(value)}")
        if not math.isfinite(value) or not 0 < value <= MAX_TIME:
            raise self._fail(name, f"expected seconds since the epoch, got {value!r}")
        return float(value)

    def step(self, name: str) -> int | None:
        value = self.doc.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_STEP:
            raise self._fail(name, f"expected a step (0..2^63-1), got {value!r}")
        return value
