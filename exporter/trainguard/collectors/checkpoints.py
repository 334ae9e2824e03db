"""Checkpoint directories, judged at scrape time against the sizes and hashes recorded when the
files were written: the newest complete step per location, truncated copies, hash mismatches,
orphaned ``.part`` files and free space. One location that cannot be read fails visibly
(``trainguard_checkpoint_location_up 0`` and a reason) while every other location answers."""

from __future__ import annotations

import errno
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from trainguard.collector import Collector, MetricSpec
from trainguard.config import CheckpointSettings
from trainguard.manifest import (
    CheckpointPattern,
    Judged,
    Listing,
    ManifestError,
    RecordCache,
    StepMemo,
    judge,
    list_directory,
    touched_ns,
)
from trainguard.targets import PRIMARY, CheckpointTarget
from trainguard.verifier import Verifier

_LOC = ("run", "location")


def _spec(name: str, help: str, labels: tuple[str, ...] = _LOC) -> MetricSpec:
    return MetricSpec(f"trainguard_checkpoint_{name}", "gauge", labels, help)


LOCATION_UP = _spec(
    "location_up",
    "1 if the location's directory and manifest could be read in this scrape, 0 if not (the "
    "location's other series are then absent and the reason is logged).",
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

Targets = Callable[[], Iterable[CheckpointTarget]]
Families = GaugeMetricFamily | CounterMetricFamily


def _reason(exc: BaseException, path: Path) -> str:
    if isinstance(exc, OSError):
        what = exc.strerror or str(exc)
        if exc.errno == errno.ELOOP:
            what += " (a symbolic link loop)"
        where = exc.filename
        return f"{what}: {where}" if where and str(where) != str(path) else what
    return str(exc)


class CheckpointsCollector(Collector):
    """Reads each location's directory (one listing, an lstat of matching names only) and its
    manifest (re-parsing only records that changed) at every scrape; hashes are checked by a
    background :class:`~trainguard.verifier.Verifier`, never inside a scrape."""

    name = "checkpoints"
    metrics = (
        LOCATION_UP,
        LAST_STEP,
        LAST_TIMESTAMP,
        FILES,
        BYTES,
        SIZE,
        EXPECTED_SIZE,
        TRUNCATED,
        OVERSIZED,
        HASH_MISMATCH,
        HASH_PENDING,
        UNRECORDED,
        UNKNOWN_MTIME,
        PARTIAL,
        PARTIAL_AGE,
        AVAIL,
    )

    def __init__(
        self,
        targets: Targets,
        settings: CheckpointSettings,
        *,
        verifier: Verifier | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._targets = targets
        self._settings = settings
        self._verifier = verifier or Verifier(settings.verify_bytes_per_second)
        self._clock_ns = clock_ns
        self._lock = threading.Lock()
        self._records: dict[Path, RecordCache] = {}
        self._patterns: dict[str, CheckpointPattern] = {}  # compiled once per pattern
        self._steps: dict[tuple[Path, str], StepMemo] = {}  # names already parsed, per location

    def gather(self, errors: list[str]) -> Iterable[Metric]:
        with self._lock:
            return self._gather(errors)

    def _gather(self, errors: list[str]) -> Iterable[Metric]:
        families = {spec.name: spec.family() for spec in self.metrics}
        now_ns = self._clock_ns()
        grace_ns = int(self._settings.grace_period_seconds * 1e9)
        unique: dict[tuple[str, str], CheckpointTarget] = {}
        for t in self._targets():
            unique.setdefault((t.run, t.location), t)
        # primaries first: a mirror without records is judged against its primary
        ordered = sorted(unique.values(), key=lambda t: (t.location != PRIMARY, t.run, t.location))
        primaries: dict[str, Listing] = {}
        for t in ordered:
            labels = [t.run, t.location]
            if t.refused is not None:
                errors.append(
                    f"checkpoints of run {t.run!r}, location {t.location!r} at {t.path}: "
                    f"{t.refused}"
                )
                families[LOCATION_UP.name].add_metric(labels, 0)
                continue
            try:
                listing = self._read(t)
                avail = shutil.disk_usage(t.path).free
            except (OSError, ManifestError, ValueError) as exc:
                errors.append(
                    f"checkpoints of run {t.run!r}, location {t.location!r} at {t.path}: "
                    f"{_reason(exc, t.path)}"
                )
                families[LOCATION_UP.name].add_metric(labels, 0)
                continue
            if t.location == PRIMARY:
                primaries[t.run] = listing
            primary = None if t.location == PRIMARY else primaries.get(t.run)
            judged = judge(
                listing,
                now_ns=now_ns,
                grace_ns=grace_ns,
                primary=primary,
                trust_unrecorded=t.trust_unrecorded,
            )
            families[LOCATION_UP.name].add_metric(labels, 1)
            families[AVAIL.name].add_metric(labels, avail)
            self._publish(families, labels, listing, judged, now_ns, errors)
        self._verifier.sweep()
        for stale in set(self._records) - {t.path for t in ordered if t.refused is None}:
            del self._records[stale]
        for pattern in set(self._patterns) - {t.pattern for t in ordered}:
            del self._patterns[pattern]
        for where in set(self._steps) - {(t.path, t.pattern) for t in ordered}:
            del self._steps[where]
        return families.values()

    def _read(self, t: CheckpointTarget) -> Listing:
        pattern = self._patterns.get(t.pattern)
        if pattern is None:
            pattern = self._patterns[t.pattern] = CheckpointPattern(t.pattern)
        cache = self._records.get(t.path)
        if cache is None:
            cache = self._records[t.path] = RecordCache(t.path)
        memo = self._steps.get((t.path, t.pattern))
        if memo is None:
            memo = self._steps[(t.path, t.pattern)] = {}
        return list_directory(t.path, pattern, cache.read(), memo)

    def _publish(
        self,
        families: dict[str, Families],
        labels: list[str],
        listing: Listing,
        judged: list[Judged],
        now_ns: int,
        errors: list[str],
    ) -> None:
        def put(spec: MetricSpec, value: float) -> None:
            families[spec.name].add_metric(labels, value)

        verifier = self._verifier
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
        complete: list[Judged] = []
        for j in judged:
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
            elif status in ("pending", "error"):
                pending += 1
            if j.complete and status != "mismatch":
                complete.append(j)
            total += st.st_size
            truncated += j.truncated
            oversized += j.oversized
            unrecorded += j.expected_size is None
            unknown += not j.mtime_known
        if complete:
            newest = max(complete, key=lambda j: (j.entry.step, j.entry.name))
            put(LAST_STEP, newest.entry.step)
            put(LAST_TIMESTAMP, newest.entry.stat.st_mtime_ns / 1e9)
        put(FILES, len(judged))
        put(BYTES, total)
        self._publish_sizes(families, labels, judged)
        put(TRUNCATED, truncated)
        put(OVERSIZED, oversized)
        put(HASH_MISMATCH, mismatched)
        put(HASH_PENDING, pending)
        put(UNRECORDED, unrecorded)
        partial_touched = [touched_ns(p.stat) for p in listing.partials]
        put(UNKNOWN_MTIME, unknown + partial_touched.count(None))
        put(PARTIAL, len(listing.partials))
        known = [t for t in partial_touched if t is not None]
        if known:
            put(PARTIAL_AGE, max(0.0, (now_ns - min(known)) / 1e9))

    def _publish_sizes(
        self, families: dict[str, Families], labels: list[str], judged: list[Judged]
    ) -> None:
        """Per-step series for the newest N steps only, so a directory of thousands of
        checkpoints does not become thousands of series. Several files of one step add up."""
        by_step: dict[int, list[Judged]] = {}
        for j in judged:
            by_step.setdefault(j.entry.step, []).append(j)
        newest = sorted(by_step, reverse=True)[: self._settings.size_series_per_location]
        for step in newest:
            files = by_step[step]
            step_labels = [*labels, str(step)]
            families[SIZE.name].add_metric(step_labels, sum(j.entry.stat.st_size for j in files))
            expected = [j.expected_size for j in files]
            if all(e is not None for e in expected):
                families[EXPECTED_SIZE.name].add_metric(
                    step_labels, sum(e for e in expected if e is not None)
                )
