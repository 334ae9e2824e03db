"""A checkpoint location's judged series, and what they were judged from.

This is the part of the checkpoints collector that turns a location's listing, records and
verifier answers into its samples (:class:`LocationJudge`), and the inputs that let a later
scrape publish the same samples again while none of them changed (:class:`Inputs`,
:class:`Verdict`).

Kept apart from the collector (``collectors/checkpoints/collector.py``), which reads the locations,
decides when a verdict still holds and publishes it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.samples import Sample

from trainguard.exporter.collectors.checkpoints.metrics import (
    BYTES,
    DAMAGED_STEP,
    EXPECTED_SIZE,
    FILES,
    HASH_MISMATCH,
    HASH_PENDING,
    JUDGED,
    LAST_FINITE_STEP,
    LAST_STEP,
    LAST_TIMESTAMP,
    OVERSIZED,
    SIZE,
    TRUNCATED,
    UNRECORDED,
)
from trainguard.exporter.collectors.checkpoints.verifier import Verifier
from trainguard.exporter.scrape.collector import MetricSpec
from trainguard.shared.listing import Listing
from trainguard.shared.manifest import Record
from trainguard.shared.verdict import Judged, StepCache, StepVerdict, judge, judge_dirs

#: a verdict with no unsettled file holds until this (or its maximum age)
FOREVER = 2**63 - 1
Families = GaugeMetricFamily | CounterMetricFamily


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


def signature(listing: Listing) -> Signature:
    files = tuple(
        (e.name, e.stat.st_ino, e.stat.st_size, e.stat.st_mtime_ns, e.stat.st_ctime_ns)
        for e in listing.files
    )
    if not listing.dirs:
        return files
    # a step directory unchanged since the last scrape is the same StepDir object (see
    # StepTreeMemo), which the comparison of two signatures takes as equal at once
    return files + tuple(listing.dirs)


class Inputs(NamedTuple):
    """Everything a location's verdict is judged from but the clock.

    Compared as one tuple, whose comparison takes an element identical to its counterpart (the
    records mapping a RecordCache returns again while unchanged) as equal at once.
    """

    signature: Signature
    records: Mapping[str, Record]
    primary: tuple[Signature, Mapping[str, Record]] | None  # its signature and records
    trust_unrecorded: bool
    grace_ns: int
    verifier_generation: int


class Verdict(NamedTuple):
    """A location's judged series and everything they were judged from.

    While none of it has changed, the next scrape publishes the same samples instead of judging
    every file again.
    """

    inputs: Inputs
    valid_until_ns: int  # the first time a file of the location (or its primary) settles
    made_at: float  # our monotonic clock
    rows: Rows
    errors: list[str]
    unknown_mtime: int


class LocationJudge:
    """Judges a location's files and step directories into its series.

    It asks the verifier about settled files (and queues the ones it does not know yet).
    """

    def __init__(
        self, verifier: Verifier, size_series: int, monotonic: Callable[[], float]
    ) -> None:
        self._verifier = verifier
        self._size_series = size_series  # per-step size series kept, newest steps first
        self._monotonic = monotonic

    def judge(
        self,
        labels: list[str],
        listing: Listing,
        primary: tuple[Listing, Signature, int] | None,
        inputs: Inputs,
        now_ns: int,
        cache: StepCache | None = None,
    ) -> Verdict:
        """The location's verdict now.

        That is its series (``labels``: run, location), the errors met verifying its files,
        and until when it holds. ``primary`` is the run's primary location (listing, signature,
        valid until) when this is a mirror; ``cache`` keeps the verdicts of settled step
        directories between scrapes.
        """
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
        valid_until = min(unsettled) + grace_ns if unsettled else FOREVER
        if primary is not None:
            valid_until = min(valid_until, primary[2])
        scratch = {spec.name: spec.family() for spec in JUDGED}
        errors: list[str] = []
        unknown = self._rows(scratch, labels, listing, judged, steps, errors)
        return Verdict(
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
        """Add the series that depend on the location's files and step directories to ``rows``.

        Only committed step directories count. Returns the number of files whose mtime is
        unknown.
        """

        def put(spec: MetricSpec, value: float) -> None:
            rows[spec.name].add_metric(labels, value)

        n_plain = len(judged)
        # a step directory's files are judged like single files; whether they are recorded is
        # a question only for directories committed by a record (a framework's marker is what
        # the others are judged by)
        by_record: list[bool] = [True] * n_plain
        if steps:
            judged = judged + [j for sv in steps for j in sv.files]
            for sv in steps:
                by_record += [sv.dir.commit == "record"] * len(sv.files)
        statuses = self._hash_statuses(listing, judged, errors)
        mismatched = pending = total = truncated = oversized = unrecorded = unknown = 0
        complete: list[tuple[int, str, int]] = []  # (step, name, mtime) of complete checkpoints
        bad_dirs: set[int] = set()  # steps of directories with a file that does not hash right
        damaged: dict[str, int] = {}  # damage -> newest step with it

        def damage(kind: str, step: int) -> None:
            damaged[kind] = max(step, damaged.get(kind, step))

        for i, (j, status) in enumerate(zip(judged, statuses, strict=True)):
            st = j.entry.stat
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
            finite = [c for c in complete if _loss_finite(listing, c[1]) is not False]
            if finite:
                put(LAST_FINITE_STEP, max(finite)[0])
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

    def _hash_statuses(
        self, listing: Listing, judged: list[Judged], errors: list[str]
    ) -> list[str]:
        """Each file's hash status: none, pending, match, mismatch or error.

        ``none`` when there is nothing to check (no recorded hash, or not the recorded size);
        only settled files are asked about, never one that may still be being written; one new
        to the verifier is queued (``pending``) and hashed in the background.
        """
        verifier = self._verifier
        asked = [
            (j.entry.stat, j.expected_sha256)
            for j in judged
            if j.settled
            and j.expected_sha256 is not None
            and j.entry.stat.st_size == j.expected_size
        ]
        answers = iter(verifier.known_many(asked))
        statuses = []
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
            statuses.append(status)
        return statuses

    def _size_rows(
        self,
        rows: dict[str, Families],
        labels: list[str],
        judged: list[Judged],
        steps: list[StepVerdict],
    ) -> None:
        """Per-step series for the newest N steps only.

        Limited so that a directory of thousands of checkpoints does not become thousands of
        series. Several files of one step (the files of a step directory) add up; a step
        directory's expected size counts the files it lacks.
        """
        by_step: dict[int, list[Judged]] = {}
        for j in judged:
            by_step.setdefault(j.entry.step, []).append(j)
        missing: dict[int, int] = {}
        for sv in steps:
            by_step.setdefault(sv.dir.step, [])
            missing[sv.dir.step] = missing.get(sv.dir.step, 0) + sv.missing_bytes
        newest = sorted(by_step, reverse=True)[: self._size_series]
        for step in newest:
            files = by_step[step]
            step_labels = [*labels, str(step)]
            rows[SIZE.name].add_metric(step_labels, sum(j.entry.stat.st_size for j in files))
            expected = [j.expected_size for j in files]
            if files and all(e is not None for e in expected):
                rows[EXPECTED_SIZE.name].add_metric(
                    step_labels, sum(e for e in expected if e is not None) + missing.get(step, 0)
                )


def _loss_finite(listing: Listing, name: str) -> bool | None:
    """What the checkpoint's own record says of the loss when it was saved (None: nothing).

    A mirror's copy carries its source's word in its own record (``checkpoint.mirror``).
    """
    record = listing.records.get(name)
    return None if record is None else record.loss_finite
