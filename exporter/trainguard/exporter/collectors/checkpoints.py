"""Checkpoint directories, judged at scrape time against the sizes and hashes recorded when the
files were written: the newest complete step per location, truncated copies, hash mismatches,
orphaned ``.part`` files and free space. One location that cannot be read fails visibly
(``trainguard_checkpoint_location_up 0`` and a reason) while every other location answers."""

from __future__ import annotations

import errno
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.samples import Sample

from trainguard.exporter.collector import Collector, MetricSpec, Setup
from trainguard.exporter.config import CheckpointSettings
from trainguard.exporter.dirwatch import CheckpointDirectory, NotMounted, RecordCache
from trainguard.exporter.scrape import Scrape
from trainguard.exporter.targets import PRIMARY, CheckpointTarget, ownership_problem
from trainguard.exporter.verifier import Verifier
from trainguard.shared.fileio import touched_ns
from trainguard.shared.listing import Listing
from trainguard.shared.manifest import ManifestError, Record
from trainguard.shared.pattern import CheckpointPattern
from trainguard.shared.steps import layout_problem
from trainguard.shared.verdict import Judged, StepCache, StepVerdict, judge, judge_dirs

_LOC = ("run", "location")


def _spec(name: str, help: str, labels: tuple[str, ...] = _LOC) -> MetricSpec:
    return MetricSpec(f"trainguard_checkpoint_{name}", "gauge", labels, help)


LOCATION_UP = _spec(
    "location_up",
    "1 if the location's directory and manifest could be read in this scrape, 0 if not (the "
    "location's other series are then absent and the reason is logged).",
)
LOCATION_INFO = _spec(
    "location_info",
    "Always 1, one series per watched location: trust_unrecorded says whether the config "
    "counts settled files without records as complete (rules alert on unrecorded files only "
    "where it is false).",
    ("run", "location", "trust_unrecorded"),
)
LAST_STEP = _spec("last_step", "Step of the newest complete checkpoint.")
LAST_TIMESTAMP = _spec(
    "last_timestamp_seconds", "Modification time of the newest complete checkpoint."
)
FILES = _spec("files", "Checkpoint files (names matching the pattern, .part not included).")
BYTES = _spec("bytes", "Total size of the checkpoint files.")
SIZE = _spec(
    "size_bytes",
    "Size of the checkpoint files of a step (newest steps only).",
    ("run", "location", "step"),
)
EXPECTED_SIZE = _spec(
    "expected_size_bytes",
    "Size recorded when the step's checkpoint was written (newest steps only).",
    ("run", "location", "step"),
)
TRUNCATED = _spec(
    "truncated_files",
    "Files smaller than their recorded size and untouched for the grace period.",
)
DAMAGED_STEP = _spec(
    "newest_damaged_step",
    "Step of the newest checkpoint file at the location that is damaged (damage: truncated, "
    "hash_mismatch); absent when none is. The rules compare it with the newest complete step "
    "of every location of the run: damage to a step held intact elsewhere (or older than an "
    "intact one) warns, damage with nothing as new intact pages.",
    ("run", "location", "damage"),
)
OVERSIZED = _spec(
    "oversized_files",
    "Files larger than their recorded size and untouched for the grace period.",
)
HASH_MISMATCH = _spec(
    "hash_mismatch_files",
    "Files of the recorded size whose content does not hash to the recorded SHA-256.",
)
HASH_PENDING = _spec(
    "hash_pending_files",
    "Files with a recorded SHA-256 and the expected size not verified yet (in the grace period, "
    "queued, or unreadable).",
)
UNRECORDED = _spec(
    "unrecorded_files",
    "Files with no recorded size to judge them by (no manifest record, and for a mirror none on "
    "the primary either): complete only where the config trusts unrecorded files.",
)
UNKNOWN_MTIME = _spec(
    "unknown_mtime_files",
    "Files and .part files whose modification time is unknown (0): never old, never complete.",
)
PARTIAL = _spec(
    "partial_files", ".part files: checkpoints being written, or left by a writer that died."
)
PARTIAL_AGE = _spec(
    "oldest_partial_age_seconds",
    "Time since the oldest .part file was last written to (absent when there is none).",
)
AVAIL = _spec(
    "filesystem_avail_bytes", "Space available to unprivileged users on the location's filesystem."
)

#: the series judged from a location's files (the rest are read afresh at every scrape)
_JUDGED = (
    LAST_STEP,
    LAST_TIMESTAMP,
    FILES,
    BYTES,
    SIZE,
    EXPECTED_SIZE,
    TRUNCATED,
    DAMAGED_STEP,
    OVERSIZED,
    HASH_MISMATCH,
    HASH_PENDING,
    UNRECORDED,
)
_FOREVER = 2**63 - 1
#: the locations to read in a scrape
Targets = Callable[[Scrape], Iterable[CheckpointTarget]]
Families = GaugeMetricFamily | CounterMetricFamily


class NotWatched(Exception):
    """A location announced in a heartbeat whose owner does not own the directory."""


def _reason(exc: BaseException, path: Path) -> str:
    if isinstance(exc, OSError):
        what = exc.strerror or str(exc)
        if exc.errno == errno.ELOOP:
            what += " (a symbolic link loop)"
        where = exc.filename
        return f"{what}: {where}" if where and str(where) != str(path) else what
    return str(exc)


#: (name, inode, size, mtime, ctime) of each checkpoint file of a listing, in listing order,
#: then (name, how it was committed, newest mtime) of each committed step directory and the
#: signature of its files
Signature = tuple[tuple[object, ...], ...]
#: a location's judged samples by family name, kept to be published again as they are
Rows = dict[str, list[Sample]]

#: a location's verdict is recomputed from scratch at least this often (in seconds of our own
#: clock) even when nothing it depends on changed, which also keeps the verifier's memory of
#: its files fresh (its ttl is far longer)
VERDICT_MAX_AGE = 60.0


def _signature(listing: Listing) -> Signature:
    files = tuple(
        (e.name, e.stat.st_ino, e.stat.st_size, e.stat.st_mtime_ns, e.stat.st_ctime_ns)
        for e in listing.files
    )
    if not listing.dirs:
        return files
    # a step directory unchanged since the last scrape is the same StepDir object (see
    # StepTreeMemo), which the comparison of two signatures takes as equal at once
    return files + tuple(listing.dirs)


class _Inputs(NamedTuple):
    """Everything a location's verdict is judged from but the clock. Compared as one tuple,
    whose comparison takes an element identical to its counterpart (the records mapping a
    RecordCache returns again while unchanged) as equal at once."""

    signature: Signature
    records: Mapping[str, Record]
    primary: tuple[Signature, Mapping[str, Record]] | None  # its signature and records
    trust_unrecorded: bool
    grace_ns: int
    verifier_generation: int


class _Verdict(NamedTuple):
    """A location's judged series and everything they were judged from: while none of it has
    changed, the next scrape publishes the same samples instead of judging every file again."""

    inputs: _Inputs
    valid_until_ns: int  # the first time a file of the location (or its primary) settles
    made_at: float  # our monotonic clock
    rows: Rows
    errors: list[str]
    unknown_mtime: int


#: a watched location: (run, location, directory, pattern, layout)
_Key = tuple[str, str, Path, str, str]


@dataclass
class _Watched:
    """Everything remembered of one location between scrapes: its records, its listing, and
    the verdict last judged from them."""

    records: RecordCache
    directory: CheckpointDirectory
    verdict: _Verdict | None = None
    steps: StepCache = field(default_factory=dict)  # settled step directories' verdicts


def _owner_check(t: CheckpointTarget) -> Callable[[os.stat_result], None]:
    """Refuse, on the stat of the directory actually read, a location announced in a
    heartbeat whose owner does not own it."""

    def check(st: os.stat_result) -> None:
        problem = ownership_problem(st, t.owner, "directory")
        if problem is not None:
            raise NotWatched(problem)

    return check


class CheckpointsCollector(Collector):
    """Reads each location's directory (one listing, an lstat of matching names only) and its
    manifest (re-read only when the manifest directory changed) at every scrape. A location
    whose files, records, primary and verifier answers are exactly as at the last scrape, and
    in which no file has settled since, publishes the same verdict without judging every file
    again. Hashes are checked by a background :class:`~trainguard.exporter.verifier.Verifier`, never
    inside a scrape."""

    name = "checkpoints"
    help = "checkpoint locations: newest complete step, truncation, free space"
    metrics = (
        LOCATION_UP,
        LOCATION_INFO,
        *_JUDGED,
        UNKNOWN_MTIME,
        PARTIAL,
        PARTIAL_AGE,
        AVAIL,
    )

    @classmethod
    def build(cls, setup: Setup) -> CheckpointsCollector:
        return cls(setup.table.checkpoint_targets, setup.config.checkpoints)

    def __init__(
        self,
        targets: Targets,
        settings: CheckpointSettings,
        *,
        verifier: Verifier | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._targets = targets
        self._settings = settings
        # not `verifier or ...`: a Verifier that knows no file yet has len() 0
        self._verifier = (
            verifier if verifier is not None else Verifier(settings.verify_bytes_per_second)
        )
        self._clock_ns = clock_ns
        self._monotonic = monotonic
        self._lock = threading.Lock()
        #: what is remembered of each location watched at the last scrape
        self._watched: dict[_Key, _Watched] = {}

    def gather(self, scrape: Scrape) -> Iterable[Metric]:
        with self._lock:
            return self._gather(scrape)

    def _gather(self, scrape: Scrape) -> Iterable[Metric]:
        families = {spec.name: spec.family() for spec in self.metrics}
        now_ns = self._clock_ns()
        grace_ns = int(self._settings.grace_period_seconds * 1e9)
        unique: dict[tuple[str, str], CheckpointTarget] = {}
        for t in self._targets(scrape):
            unique.setdefault((t.run, t.location), t)
        # primaries first: a mirror without records is judged against its primary
        ordered = sorted(unique.values(), key=lambda t: (t.location != PRIMARY, t.run, t.location))
        primaries: dict[str, tuple[Listing, Signature, int]] = {}
        watched: dict[_Key, _Watched] = {}
        for t in ordered:
            labels = [t.run, t.location]
            at = (t.run, t.location, t.path, t.pattern, t.layout)
            families[LOCATION_INFO.name].add_metric(
                [*labels, "true" if t.trust_unrecorded else "false"], 1
            )
            try:
                w = watched[at] = self._watched.get(at) or self._watch(t)
                if t.location != PRIMARY and t.run in primaries:
                    w.directory.fallback = primaries[t.run][0].layout
                listing = w.directory.read(w.records, _owner_check(t))
                avail = shutil.disk_usage(t.path).free
            except (OSError, ManifestError, NotMounted, ValueError, NotWatched) as exc:
                scrape.error(
                    f"checkpoints of run {t.run!r}, location {t.location!r} at {t.path}: "
                    f"{_reason(exc, t.path)}"
                )
                families[LOCATION_UP.name].add_metric(labels, 0)
                continue
            signature = _signature(listing)
            primary = None if t.location == PRIMARY else primaries.get(t.run)
            inputs = _Inputs(
                signature,
                listing.records,
                None if primary is None else (primary[1], primary[0].records),
                t.trust_unrecorded,
                grace_ns,
                self._verifier.generation,  # before asking it: a later answer invalidates
            )
            verdict = w.verdict
            if (
                verdict is None
                or verdict.inputs != inputs
                or now_ns >= verdict.valid_until_ns
                or self._monotonic() - verdict.made_at >= VERDICT_MAX_AGE
            ):
                verdict = w.verdict = self._judge(labels, listing, primary, inputs, now_ns, w.steps)
            if t.location == PRIMARY:
                primaries[t.run] = (listing, signature, verdict.valid_until_ns)
            families[LOCATION_UP.name].add_metric(labels, 1)
            families[AVAIL.name].add_metric(labels, avail)
            for family, samples in verdict.rows.items():
                families[family].samples.extend(samples)
            for message in verdict.errors:
                scrape.error(message)
            self._publish_partials(families, labels, listing, verdict.unknown_mtime, now_ns)
        self._watched = watched  # a location no longer watched is forgotten whole
        self._verifier.sweep()
        return families.values()

    def _watch(self, t: CheckpointTarget) -> _Watched:
        pattern = CheckpointPattern(t.pattern)
        problem = layout_problem(t.layout)
        if problem:
            raise ValueError(f"checkpoint layout: {problem}")
        return _Watched(
            RecordCache(t.path, clock=self._monotonic),
            CheckpointDirectory(t.path, pattern, layout=t.layout, clock=self._monotonic),
        )

    def _judge(
        self,
        labels: list[str],
        listing: Listing,
        primary: tuple[Listing, Signature, int] | None,
        inputs: _Inputs,
        now_ns: int,
        cache: StepCache | None = None,
    ) -> _Verdict:
        grace_ns = inputs.grace_ns
        plisting = None if primary is None else primary[0]
        judged = judge(
            listing,
            now_ns=now_ns,
            grace_ns=grace_ns,
            primary=plisting,
            trust_unrecorded=inputs.trust_unrecorded,
        )
        steps = judge_dirs(
            listing,
            now_ns=now_ns,
            grace_ns=grace_ns,
            primary=plisting,
            trust_unrecorded=inputs.trust_unrecorded,
            cache=cache,
        )
        # the verdict holds until the first unsettled file or step directory (here or on the
        # primary) settles
        unsettled = [j.entry.stat.st_mtime_ns for j in judged if j.mtime_known and not j.settled]
        for sv in steps:
            if sv.dir.touched_ns is not None and not sv.settled:
                unsettled.append(sv.dir.touched_ns)
            unsettled += [
                j.entry.stat.st_mtime_ns for j in sv.files if j.mtime_known and not j.settled
            ]
        if plisting is not None:  # a mirror's step is judged against the primary's once settled
            unsettled += [
                d.touched_ns
                for d in plisting.dirs
                if d.touched_ns is not None and d.touched_ns > now_ns - grace_ns
            ]
        valid_until = min(unsettled) + grace_ns if unsettled else _FOREVER
        if primary is not None:
            valid_until = min(valid_until, primary[2])
        scratch = {spec.name: spec.family() for spec in _JUDGED}
        errors: list[str] = []
        unknown = self._rows(scratch, labels, listing, judged, steps, errors)
        return _Verdict(
            inputs=inputs,
            valid_until_ns=valid_until,
            made_at=self._monotonic(),
            rows={name: family.samples for name, family in scratch.items() if family.samples},
            errors=errors,
            unknown_mtime=unknown,
        )

    def _rows(
        self,
        rows: dict[str, Families],
        labels: list[str],
        listing: Listing,
        judged: list[Judged],
        steps: list[StepVerdict],
        errors: list[str],
    ) -> int:
        """The location's series that depend on its files and committed step directories, into
        ``rows``; returns the number of files whose mtime is unknown."""

        def put(spec: MetricSpec, value: float) -> None:
            rows[spec.name].add_metric(labels, value)

        verifier = self._verifier
        n_plain = len(judged)
        # a step directory's files are judged like single files; whether they are recorded is
        # a question only for directories committed by a record (a framework's marker is what
        # the others are judged by)
        by_record: list[bool] = [True] * n_plain
        if steps:
            judged = judged + [j for sv in steps for j in sv.files]
            for sv in steps:
                by_record += [sv.dir.commit == "record"] * len(sv.files)
        # never hash a file that may still be being written: only settled files are asked about
        asked = [
            (j.entry.stat, j.expected_sha256)
            for j in judged
            if j.settled
            and j.expected_sha256 is not None
            and j.entry.stat.st_size == j.expected_size
        ]
        answers = iter(verifier.known_many(asked))
        mismatched = pending = total = truncated = oversized = unrecorded = unknown = 0
        complete: list[tuple[int, str, int]] = []  # (step, name, mtime) of complete checkpoints
        bad_dirs: set[int] = set()  # steps of directories with a file that does not hash right
        damaged: dict[str, int] = {}  # damage -> newest step with it

        def damage(kind: str, step: int) -> None:
            damaged[kind] = max(step, damaged.get(kind, step))

        for i, j in enumerate(judged):
            st = j.entry.stat
            status = "none"
            if j.expected_sha256 is not None and st.st_size == j.expected_size:
                status = "pending"
                if j.settled:
                    answer = next(answers)
                    if answer is None:  # new to the verifier: queue it
                        path = listing.directory / j.entry.name
                        answer = verifier.status(path, st, j.expected_sha256)
                    status, detail = answer
                    if status == "error":
                        errors.append(f"cannot verify {listing.directory / j.entry.name}: {detail}")
            if status == "mismatch":
                mismatched += 1
                damage("hash_mismatch", j.entry.step)
                if i >= n_plain:
                    bad_dirs.add(j.entry.step)
            elif status in ("pending", "error"):
                pending += 1
            if i < n_plain and j.complete and status != "mismatch":
                complete.append((j.entry.step, j.entry.name, st.st_mtime_ns))
            total += st.st_size
            truncated += j.truncated
            if j.truncated:
                damage("truncated", j.entry.step)
            oversized += j.oversized
            unrecorded += j.expected_size is None and by_record[i]
            unknown += not j.mtime_known
        for sv in steps:
            truncated += sv.missing
            if sv.missing:
                damage("truncated", sv.dir.step)
            d = sv.dir
            if sv.complete and d.step not in bad_dirs and d.touched_ns is not None:
                complete.append((d.step, d.name, d.touched_ns))
        if complete:
            newest = max(complete)
            put(LAST_STEP, newest[0])
            put(LAST_TIMESTAMP, newest[2] / 1e9)
        put(FILES, len(judged))
        put(BYTES, total)
        self._size_rows(rows, labels, judged, steps)
        put(TRUNCATED, truncated)
        for kind, step in sorted(damaged.items()):
            rows[DAMAGED_STEP.name].add_metric([*labels, kind], step)
        put(OVERSIZED, oversized)
        put(HASH_MISMATCH, mismatched)
        put(HASH_PENDING, pending)
        put(UNRECORDED, unrecorded)
        return unknown

    def _publish_partials(
        self,
        families: dict[str, Families],
        labels: list[str],
        listing: Listing,
        unknown_files: int,
        now_ns: int,
    ) -> None:
        """The ``.part`` series, with step directories not committed counted as ``.part`` files:
        judged afresh at every scrape (there are few, and their age moves with the clock)."""
        partial_touched = [touched_ns(p.stat) for p in listing.partials]
        partial_touched += [d.touched_ns for d in listing.inflight]
        families[UNKNOWN_MTIME.name].add_metric(labels, unknown_files + partial_touched.count(None))
        families[PARTIAL.name].add_metric(labels, len(partial_touched))
        known = [t for t in partial_touched if t is not None]
        if known:
            families[PARTIAL_AGE.name].add_metric(labels, max(0.0, (now_ns - min(known)) / 1e9))

    def _size_rows(
        self,
        rows: dict[str, Families],
        labels: list[str],
        judged: list[Judged],
        steps: list[StepVerdict],
    ) -> None:
        """Per-step series for the newest N steps only, so a directory of thousands of
        checkpoints does not become thousands of series. Several files of one step (the files
        of a step directory) add up; a step directory's expected size counts the files it
        lacks."""
        by_step: dict[int, list[Judged]] = {}
        for j in judged:
            by_step.setdefault(j.entry.step, []).append(j)
        missing: dict[int, int] = {}
        for sv in steps:
            by_step.setdefault(sv.dir.step, [])
            missing[sv.dir.step] = missing.get(sv.dir.step, 0) + sv.missing_bytes
        newest = sorted(by_step, reverse=True)[: self._settings.size_series_per_location]
        for step in newest:
            files = by_step[step]
            step_labels = [*labels, str(step)]
            rows[SIZE.name].add_metric(step_labels, sum(j.entry.stat.st_size for j in files))
            expected = [j.expected_size for j in files]
            if files and all(e is not None for e in expected):
                rows[EXPECTED_SIZE.name].add_metric(
                    step_labels, sum(e for e in expected if e is not None) + missing.get(step, 0)
                )
