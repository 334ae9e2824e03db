"""Checkpoint directories, judged at scrape time against what was recorded when written.

What was recorded is the files' sizes and hashes. Judged are: the newest complete step per
location, truncated copies, hash mismatches, orphaned ``.part`` files and free space. One
location that cannot be read fails visibly (``trainguard_checkpoint_location_up 0`` and a
reason) while every other location answers.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.core import Metric

from trainguard.exporter.collectors.checkpoints import saves as save_outcomes
from trainguard.exporter.collectors.checkpoints.dirwatch import (
    CheckpointDirectory,
    NotMounted,
    RecordCache,
)
from trainguard.exporter.collectors.checkpoints.metrics import (
    AVAIL,
    LOCATION_INFO,
    LOCATION_UP,
    METRICS,
    PARTIAL,
    PARTIAL_AGE,
    UNKNOWN_MTIME,
)
from trainguard.exporter.collectors.checkpoints.verdict_cache import VerdictCache
from trainguard.exporter.collectors.checkpoints.verdicts import (
    VERDICT_MAX_AGE,
    Families,
    Inputs,
    LocationJudge,
    Signature,
    Verdict,
    signature,
)
from trainguard.exporter.collectors.checkpoints.verifier import Verifier
from trainguard.exporter.config.model import CheckpointSettings
from trainguard.exporter.runs.table import Setup
from trainguard.exporter.runs.targets import PRIMARY, CheckpointTarget, ownership_problem
from trainguard.exporter.scrape.collector import Collector
from trainguard.exporter.scrape.context import Scrape
from trainguard.shared.fileio import touched_ns
from trainguard.shared.listing import Listing
from trainguard.shared.manifest import ManifestError
from trainguard.shared.pattern import CheckpointPattern
from trainguard.shared.steps import layout_problem
from trainguard.shared.verdict import StepCache

#: the locations to read in a scrape
Targets = Callable[[Scrape], Iterable[CheckpointTarget]]


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


#: a watched location: (run, location, directory, pattern, layout)
_Key = tuple[str, str, Path, str, str]


@dataclass
class _Watched:
    """Everything remembered of one location between scrapes.

    That is its records, its listing, and the verdict last judged from them.
    """

    records: RecordCache
    directory: CheckpointDirectory
    verdict: Verdict | None = None
    steps: StepCache = field(default_factory=dict)  # settled step directories' verdicts


def _owner_check(t: CheckpointTarget) -> Callable[[os.stat_result], None]:
    """Refuse a location announced in a heartbeat whose owner does not own it.

    Checked on the stat of the directory actually read.
    """

    def check(st: os.stat_result) -> None:
        problem = ownership_problem(st, t.owner, "directory")
        if problem is not None:
            raise NotWatched(problem)

    return check


class CheckpointsCollector(Collector):
    """Reads each location's directory and its manifest at every scrape.

    The directory in one listing and an lstat of matching names only; the manifest is re-read only
    when the manifest directory changed. A location whose files, records, primary and verifier
    answers are exactly as at the last scrape, and in which no file has settled since, publishes the
    same verdict without judging every file again. Hashes are checked by a background
    :class:`~trainguard.exporter.collectors.checkpoints.verifier.Verifier`, never inside a scrape.
    """

    name = "checkpoints"
    help = "checkpoint locations: newest complete step, truncation, free space"
    metrics = METRICS

    @classmethod
    def build(cls, setup: Setup) -> CheckpointsCollector:
        collector = cls(
            setup.table.checkpoint_targets, setup.config.checkpoints, state_dir=setup.state_dir
        )
        collector.shared_reads = (setup.table.view,)
        return collector

    def __init__(
        self,
        targets: Targets,
        settings: CheckpointSettings,
        *,
        verifier: Verifier | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
        monotonic: Callable[[], float] = time.monotonic,
        state_dir: Path | None = None,
    ) -> None:
        self._targets = targets
        self._state_dir = state_dir  # where the saves' outcomes are (None: not published)
        self._settings = settings
        # not `verifier or ...`: a Verifier that knows no file yet has len() 0
        self._verifier = (
            verifier
            if verifier is not None
            else Verifier(
                settings.verify_bytes_per_second,
                cache=VerdictCache(settings.verify_cache) if settings.verify_cache else None,
            )
        )
        self._judge = LocationJudge(self._verifier, settings.size_series_per_location, monotonic)
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
            if self._state_dir is not None:  # also while the directory cannot be read
                save_outcomes.publish(families, self._state_dir, t, scrape)
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
            sig = signature(listing)
            primary = None if t.location == PRIMARY else primaries.get(t.run)
            inputs = Inputs(
                sig,
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
                verdict = w.verdict = self._judge.judge(
                    labels, listing, primary, inputs, now_ns, w.steps
                )
            if t.location == PRIMARY:
                primaries[t.run] = (listing, sig, verdict.valid_until_ns)
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

    def _publish_partials(
        self,
        families: dict[str, Families],
        labels: list[str],
        listing: Listing,
        unknown_files: int,
        now_ns: int,
    ) -> None:
        """The ``.part`` series, with step directories not committed counted as ``.part`` files.

        Judged afresh at every scrape (there are few, and their age moves with the clock).
        """
        partial_touched = [touched_ns(p.stat) for p in listing.partials]
        partial_touched += [d.touched_ns for d in listing.inflight]
        families[UNKNOWN_MTIME.name].add_metric(labels, unknown_files + partial_touched.count(None))
        families[PARTIAL.name].add_metric(labels, len(partial_touched))
        known = [t for t in partial_touched if t is not None]
        if known:
            families[PARTIAL_AGE.name].add_metric(labels, max(0.0, (now_ns - min(known)) / 1e9))
