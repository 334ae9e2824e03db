"""``trainguard verify``: every checkpoint of a location with its verdict.

The verdict is the one the exporter and ``trainguard.checkpoint.latest`` share
(``trainguard.shared.verdict.judge``), and the one ``latest()`` would resume from. A step directory
(a framework's or ``save_dir``'s) is one item, named ``<dir>/``, judged as a whole
(``judge_dirs``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trainguard.checkpoint.retention import Checkpoint, latest
from trainguard.shared.fileio import FILE_FLAGS, sha256_fd
from trainguard.shared.listing import Listing, read_listing
from trainguard.shared.manifest import Record
from trainguard.shared.pattern import CheckpointPattern
from trainguard.shared.stepdir import Entry, InFlight
from trainguard.shared.verdict import Judged, StepVerdict, judge, judge_dirs

#: called with (name, bytes) before hashing a file, returns the per-read callback
HashProgress = Callable[[str, int], Callable[[int], None]]


@dataclass
class Item:
    name: str
    step: int
    verdict: str  # complete, truncated, oversized, hash mismatch, unrecorded, in flight,
    # orphaned .part, unknown mtime
    size: int
    expected_size: int | None
    detail: str = ""
    hash_ok: bool | None = None  # with --hash: None when not hashed
    #: its record's word on the loss when it was saved (None: the record says nothing)
    loss_finite: bool | None = None


@dataclass
class Report:
    directory: str
    primary: str | None
    items: list[Item]
    resume_from: str | None  # what latest() returns: never one saved with a NaN loss
    resume_step: int | None
    newest: str | None  # the newest finished checkpoint (not .part)
    ok: bool  # the newest checkpoint is complete
    hint: str | None = None  # no checkpoint under the pattern, but a framework's names here

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _verdict(j: Judged) -> tuple[str, str]:
    st = j.entry.stat
    if not j.mtime_known:
        return "unknown mtime", "modification time 0: never complete (NFS/FUSE stat?)"
    if j.expected_size is None and not j.complete:
        return "unrecorded", "no manifest record (nor one on the primary) to check its size"
    if j.truncated:
        return "truncated", f"{st.st_size}/{j.expected_size} bytes"
    if j.oversized:
        return "oversized", f"{st.st_size}/{j.expected_size} bytes"
    if j.complete:
        return "complete", f"{st.st_size} bytes"
    return "in flight", f"{st.st_size}/{j.expected_size} bytes, touched within the grace period"


def verify(
    path: Path,
    *,
    primary: Path | None,
    pattern: str,
    grace: float,
    check_hash: bool,
    progress: HashProgress | None = None,
) -> Report:
    """Every checkpoint at ``path`` (a location, or one checkpoint in it) with its verdict.

    Raises FileNotFoundError, NotADirectoryError, ValueError or ManifestError on bad input.
    """
    pat = CheckpointPattern(pattern)
    path, only = _target(path, pat, pattern)
    if primary is not None and not primary.is_dir():
        raise FileNotFoundError(f"--primary {primary}: not an existing directory")
    listing = read_listing(path, pat)
    plisting: Listing | None = read_listing(primary, pat) if primary is not None else None
    now_ns, grace_ns = time.time_ns(), int(grace * 1e9)

    def wanted(name: str) -> bool:
        return only is None or name == only

    items = [
        _file_item(j, path, check_hash, progress)
        for j in judge(listing, now_ns=now_ns, grace_ns=grace_ns, primary=plisting)
        if wanted(j.entry.name)
    ]
    items += [
        _dir_item(sv, path, check_hash, progress)
        for sv in judge_dirs(listing, now_ns=now_ns, grace_ns=grace_ns, primary=plisting)
        if only is None or sv.dir.name == only.rstrip("/")
    ]
    items += [_inflight_item(d, now_ns, grace_ns) for d in listing.inflight if wanted(d.name)]
    items += [_partial_item(e, now_ns, grace_ns) for e in listing.partials if wanted(e.name)]
    _mark_nonfinite_loss(
        items, {**(plisting.records if plisting is not None else {}), **listing.records}
    )
    items.sort(key=lambda i: (i.step, i.name), reverse=True)
    found = _resume_from(path, primary, pattern, grace, check_hash, items)
    partial = {e.name for e in listing.partials} | {d.name + "/" for d in listing.inflight}
    finished = [i for i in items if i.name not in partial]
    newest = finished[0] if finished else None
    return Report(
        directory=str(path),
        primary=str(primary) if primary else None,
        items=items,
        resume_from=found.path.name if found else None,
        resume_step=found.step if found else None,
        newest=newest.name if newest else None,
        ok=newest is not None and newest.verdict == "complete",
        hint=None if items or only is not None else pattern_hint(path, pattern),
    )


def _target(path: Path, pat: CheckpointPattern, pattern: str) -> tuple[Path, str | None]:
    """The location to list, and the one checkpoint in it asked for (None: all of them).

    A checkpoint is judged against its location's manifest and neighbours, so a step directory
    or a file given on the command line is verified from its parent's listing.
    """
    if not path.exists():
        raise FileNotFoundError(f"{path}: does not exist")
    if path.is_dir() and (
        pat.dir_step(path.name) is not None or pat.temp_dir_step(path.name) is not None
    ):
        return path.parent, path.name  # one step directory
    if not path.is_dir():
        if pat.step(path.name) is None and pat.partial_step(path.name) is None:
            raise ValueError(f"{path}: not a checkpoint name under the pattern {pattern!r}")
        return path.parent, path.name
    return path, None


def _file_item(j: Judged, path: Path, check_hash: bool, progress: HashProgress | None) -> Item:
    """A single checkpoint file as one item; with ``--hash``, a complete one is hashed too.

    Only a complete file is hashed: a short or unrecorded one already has its verdict, and
    hashing it would only cost a read of the whole file.
    """
    verdict, detail = _verdict(j)
    item = Item(j.entry.name, j.entry.step, verdict, j.entry.stat.st_size, j.expected_size, detail)
    if check_hash and verdict == "complete":
        if j.expected_sha256 is None:
            item.detail += ", no recorded SHA-256 to check"
        else:
            sha, _ = _hash(path / j.entry.name, j.entry.stat.st_size, progress)
            item.hash_ok = sha == j.expected_sha256
            if not item.hash_ok:
                item.verdict, item.detail = "hash mismatch", "content differs from its record"
            else:
                item.detail += ", SHA-256 verified"
    return item


def _inflight_item(d: InFlight, now_ns: int, grace_ns: int) -> Item:
    """An uncommitted step directory: still being written, or left by a writer that died.

    Its files have no verdict of their own: until it is committed it is not a checkpoint, and
    only its age tells a save in progress from an orphan.
    """
    if d.touched_ns is None:
        verdict, detail = "unknown mtime", "step directory with a modification time 0"
    elif now_ns - d.touched_ns < grace_ns:
        verdict, detail = "in flight", f"step directory being written ({d.files} files)"
    else:
        age = (now_ns - d.touched_ns) / 1e9
        verdict = "orphaned .part"
        detail = f"step directory never committed, untouched for {age:.0f}s: its writer died"
    return Item(d.name + "/", d.step, verdict, 0, None, detail)


def _partial_item(e: Entry, now_ns: int, grace_ns: int) -> Item:
    """A ``.part`` file: a save in progress, or one whose writer died (by its age)."""
    mtime = e.stat.st_mtime_ns
    if mtime <= 0:
        verdict, detail = "unknown mtime", ".part with modification time 0"
    elif now_ns - mtime < grace_ns:
        verdict, detail = "in flight", f".part being written ({e.stat.st_size} bytes so far)"
    else:
        age = (now_ns - mtime) / 1e9
        verdict, detail = "orphaned .part", f"untouched for {age:.0f}s: its writer died"
    return Item(e.name, e.step, verdict, e.stat.st_size, None, detail)


def _mark_nonfinite_loss(items: list[Item], records: Mapping[str, Record]) -> None:
    """Give each item its record's word on the loss at save time, in place.

    A complete checkpoint saved with a NaN loss is one ``latest()`` will not resume from: the
    table says so next to it, or the resume line would look wrong.
    """
    for i in items:
        record = records.get(i.name.rstrip("/"))
        i.loss_finite = None if record is None else record.loss_finite
        if i.loss_finite is False:
            i.detail += ", saved with a NaN or infinite loss"


def _resume_from(
    path: Path,
    primary: Path | None,
    pattern: str,
    grace: float,
    check_hash: bool,
    items: list[Item],
) -> Checkpoint | None:
    """What ``latest()`` resumes from: it names the checkpoint, so the two can never disagree.

    With ``--hash``, the files hashed for the table are not hashed again unless the one it
    picks failed (or had no hash to check): then it is asked again, verifying hashes itself.
    """
    found = latest(path, primary=primary, pattern=pattern, grace=grace)
    picked = next((i for i in items if found and i.name.rstrip("/") == found.path.name), None)
    if check_hash and found is not None and (picked is None or picked.hash_ok is not True):
        found = latest(path, primary=primary, pattern=pattern, grace=grace, verify_hash=True)
    return found


#: the names frameworks give their checkpoints, for the hint when --pattern matches nothing
FRAMEWORK_PATTERNS = (
    ("checkpoint-{step}", "Hugging Face Trainer"),
    ("epoch={epoch}-step={step}", "Lightning's default ModelCheckpoint"),
    ("*step={step}", "Lightning's ModelCheckpoint"),
    ("global_step{step}", "DeepSpeed"),
    ("iter_{step}", "Megatron-LM"),
    ("{step}", "Orbax"),
    ("step_{step}", "trainguard's default"),
)


def pattern_hint(path: Path, pattern: str) -> str | None:
    """The ``--pattern`` that would find a framework's names in ``path``, else None.

    Only when no name in ``path`` matches ``pattern`` but a framework's names are there (one
    listing of the directory).
    """
    try:
        names = [e.name for e in os.scandir(path)]
    except OSError:
        return None
    for candidate, who in FRAMEWORK_PATTERNS:
        if candidate == pattern:
            continue
        pat = CheckpointPattern(candidate)
        found = sum(1 for n in names if pat.step(n) is not None or pat.dir_step(n) is not None)
        if found:
            return (
                f"no name matches --pattern {pattern!r}, but {found} match {candidate!r} "
                f"({who}): try --pattern '{candidate}'"
            )
    return None


def _dir_item(sv: StepVerdict, path: Path, check_hash: bool, progress: HashProgress | None) -> Item:
    """A committed step directory as one item."""
    d = sv.dir
    size = sum(j.entry.stat.st_size for j in sv.files)
    expected = [j.expected_size for j in sv.files]
    exp_total = (
        sum(e for e in expected if e is not None) + sv.missing_bytes
        if all(e is not None for e in expected)
        else None
    )
    how = "its record" if d.commit == "record" else "its framework's marker"
    bad = sum(j.truncated for j in sv.files) + sv.missing
    if d.touched_ns is None or any(not j.mtime_known for j in sv.files):
        verdict, detail = "unknown mtime", "a file or directory under it has modification time 0"
    elif bad:
        verdict = "truncated"
        detail = f"{bad} file(s) short or missing ({sv.missing} missing), {size} bytes"
    elif any(j.oversized for j in sv.files):
        verdict, detail = "oversized", "file(s) larger than expected"
    elif sv.complete:
        verdict, detail = "complete", f"{len(sv.files)} files, {size} bytes, committed by {how}"
    else:
        verdict = "in flight"
        detail = f"committed by {how}, touched within the grace period or not yet whole"
    item = Item(d.name + "/", d.step, verdict, size, exp_total, detail)
    if check_hash and verdict == "complete":
        hashed = [j for j in sv.files if j.expected_sha256 is not None]
        if not hashed:
            item.detail += ", no recorded SHA-256 to check"
            return item
        item.hash_ok = all(
            _hash(path / j.entry.name, j.entry.stat.st_size, progress)[0] == j.expected_sha256
            for j in hashed
        )
        if item.hash_ok:
            item.detail += f", SHA-256 of {len(hashed)} files verified"
        else:
            item.verdict, item.detail = "hash mismatch", "a file differs from its record"
    return item


def _hash(path: Path, total: int, progress: HashProgress | None) -> tuple[str, int]:
    fd = os.open(path, os.O_RDONLY | FILE_FLAGS)
    try:
        if progress is None:
            return sha256_fd(fd)
        advance = progress(path.name, total)

        def before_read(_: int) -> None:
            advance(os.lseek(fd, 0, os.SEEK_CUR))

        result = sha256_fd(fd, before_read=before_read)
        advance(result[1])
        return result
    finally:
        os.close(fd)


def plain(report: Report) -> str:
    lines = [f"trainguard verify: {report.directory}"]
    if report.primary:
        lines[0] += f" (mirror of {report.primary})"
    width = max([len(i.name) for i in report.items] + [4])
    vwidth = max([len(i.verdict) for i in report.items] + [7])
    for i in report.items:
        lines.append(f"  {i.name.ljust(width)}  {i.verdict.ljust(vwidth)}  {i.detail}")
    if not report.items:
        lines.append("  (no checkpoints)")
    if report.hint:
        lines.append(f"hint: {report.hint}")
    # complete but saved with a NaN loss, newer than what latest() resumes from
    skipped = [
        i.name
        for i in report.items
        if i.loss_finite is False
        and i.verdict == "complete"
        and (report.resume_step is None or i.step > report.resume_step)
    ]
    lines.append(
        f"resume from: {report.resume_from} (step {report.resume_step}"
        + (", the newest saved with a finite loss" if skipped else "")
        + ")"
        if report.resume_from
        else "resume from: nothing (no complete checkpoint"
        + (" saved with a finite loss" if skipped else "")
        + ")"
    )
    if skipped:
        lines.append(f"not resuming from (saved with a NaN loss): {', '.join(skipped)}")
    lines.append(
        "newest checkpoint complete: yes"
        if report.ok
        else f"newest checkpoint complete: NO ({report.newest or 'no checkpoint'})"
    )
    return "\n".join(lines) + "\n"


COLOURS = {
    "complete": "green",
    "in flight": "cyan",
    "unrecorded": "yellow",
    "unknown mtime": "yellow",
    "orphaned .part": "yellow",
}


def rich_view(report: Report) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    title = f"trainguard verify: {report.directory}"
    if report.primary:
        title += f" (mirror of {report.primary})"
    table = Table(title=title, title_justify="left", box=None, header_style="bold")
    for col in ("checkpoint", "step", "verdict", "detail"):
        table.add_column(col, overflow="fold")
    for i in report.items:
        style = COLOURS.get(i.verdict, "bold red")
        mark = " ◀ resume" if i.name == report.resume_from else ""
        table.add_row(i.name, str(i.step), f"[{style}]{i.verdict}[/]", i.detail + mark)
    tail = [line for line in plain(report).splitlines() if not line.startswith("not resuming")]
    return Group(
        table,
        Text(tail[-2], style="bold"),
        Text(tail[-1], style="green" if report.ok else "bold red"),
    )
