"""Training runs: alive or gone, finished or not, progress, memory and recorded deaths.

The memory is the allocator's view; the deaths are those a restarted run recorded. Everything
comes from the shared run table (heartbeat files and the config file) at scrape time; see
docs/metrics.md for what each series means and when it is absent.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

from prometheus_client.core import Metric

from trainguard.exporter.collectors.runs.metrics import (
    ALLOC_RETRIES,
    ALLOCATED,
    COMPUTE,
    DATA_WAIT,
    DEATHS,
    DEVICE_INFO,
    DEVICE_TOTAL,
    EXIT_INFO,
    FINISHED,
    FIRST_STEP,
    HEARTBEAT_AGE,
    HEARTBEAT_FILE_ERRORS,
    HEARTBEAT_FILE_INVALID,
    HEARTBEAT_FILES,
    HEARTBEAT_TIMESTAMP,
    INACTIVE_SPLIT,
    JOB_ATTEMPT,
    JOB_INFO,
    LAST_DEATH_AGE,
    LAST_DEATH_INFO,
    LAST_DEATH_JOB,
    LAST_DEATH_STEP,
    LAST_DEATH_TIMESTAMP,
    LAST_DEATH_XID,
    LOG_MODIFIED,
    LOSS_FIRST_STEP,
    LOSS_LAST_FINITE_STEP,
    LOSS_STREAK,
    MAX_ALLOCATED,
    METRICS,
    NONFINITE,
    OOMS,
    PROCESS_UP,
    RESERVED,
    RUN_INFO,
    SCALAR,
    SNAPSHOT_DUMPS,
    SNAPSHOT_FAILURES,
    SNAPSHOT_HISTORY,
    SNAPSHOT_RECENT,
    SNAPSHOTS,
    START_AGE,
    START_TIMESTAMP,
    STARTING,
    STATE_DIR_PRESENT,
    STEP,
    STEP_AGE,
    STEP_TIMESTAMP,
    STOP_REQUESTED,
    STUCK_INFO,
    TIMED_STEPS,
)
from trainguard.exporter.runs.rows import age, exit_of, last_death, starting, stuck_at
from trainguard.exporter.runs.table import RunRow, RunTable, RunView, Setup
from trainguard.exporter.runs.targets import ownership_problem
from trainguard.exporter.scrape.collector import MAX_LOGGED_ERRORS, Collector, printable
from trainguard.exporter.scrape.context import Scrape
from trainguard.shared.heartbeat.record import SNAPSHOT_REASONS, Heartbeat

log = logging.getLogger(__name__)

#: logged when the state dir is missing (at start-up by the cli, later by the collector)
STATE_DIR_MISSING = (
    "state dir %s does not exist or cannot be listed: no training run is watched until it "
    "does (is --state.dir the directory the training jobs write to, $TRAINGUARD_STATE_DIR on "
    "their side?)"
)
#: heartbeat files published with a series of their own at most (the count has them all)
MAX_INVALID_SERIES = 100


class RunsCollector(Collector):
    """Publishes every row of the run table: its process, progress, memory, health and deaths.

    It judges nothing itself: what a row means (starting, ended, stuck, a run's last death) is
    :mod:`trainguard.exporter.runs.rows`'s, shared with ``trainguard status``.
    """

    name = "runs"
    help = "training runs, from heartbeat files and the config file"
    metrics = METRICS

    @classmethod
    def build(cls, setup: Setup) -> RunsCollector:
        collector = cls(setup.table)
        collector.shared_reads = (setup.table.view,)
        return collector

    def __init__(self, table: RunTable) -> None:
        self._table = table
        self._logged_lock = threading.Lock()
        self._logged: dict[str, str] = {}  # bad file -> why, as last logged
        self._present: bool | None = None  # the state dir, as last logged

    def gather(self, scrape: Scrape) -> Iterable[Metric]:
        view = self._table.view(scrape)
        for message in view.errors:
            scrape.error(message)
        self._log_changes(view)
        fam: dict[str, Any] = {spec.name: spec.family() for spec in self.metrics}
        now = time.time()  # after the view was read: every age is >= 0 on one clock
        for row in view.rows:
            self._row(fam, row, now)
        self._deaths(fam, view, now)
        self._logs(fam, view, scrape)
        fam[HEARTBEAT_FILES.name].add_metric([], view.files_ok)
        fam[HEARTBEAT_FILE_ERRORS.name].add_metric([], view.file_errors)
        for name, _why in sorted(view.bad_files)[:MAX_INVALID_SERIES]:
            fam[HEARTBEAT_FILE_INVALID.name].add_metric([printable(name)], 1)  # any bytes
        path = str(self._table.state_dir)
        fam[STATE_DIR_PRESENT.name].add_metric([path], 1 if view.state_dir_present else 0)
        return fam.values()

    def _log_changes(self, view: RunView) -> None:
        """Log a bad heartbeat file once (again when its reason changes), the state dir's state.

        A bad file is no failure of the collector (every other run is published): it is logged
        here rather than reported as the collector's error.
        """
        with self._logged_lock:
            current = dict(view.bad_files)
            new = [why for name, why in current.items() if self._logged.get(name) != why]
            self._logged = current
            present, self._present = self._present, view.state_dir_present
        for why in new[:MAX_LOGGED_ERRORS]:
            log.warning("heartbeat file %s", printable(why))
        if len(new) > MAX_LOGGED_ERRORS:
            log.warning(
                "%d more new errors not logged (bad heartbeat files)", len(new) - MAX_LOGGED_ERRORS
            )
        if present is True and not view.state_dir_present:  # missing at start: the cli says so
            log.warning(STATE_DIR_MISSING, self._table.state_dir)
        elif present is False and view.state_dir_present:
            log.info("state dir %s is there: runs are watched", self._table.state_dir)

    def _row(self, fam: dict[str, Any], row: RunRow, now: float) -> None:
        labels = [row.run, row.rank]
        pid = "" if row.pid is None else str(row.pid)
        fam[RUN_INFO.name].add_metric([row.run, row.rank, row.host, pid], 1)
        starting = _add_starting(fam, row)  # alive, not training yet: not judged on progress
        if row.up is not None and not starting:
            fam[PROCESS_UP.name].add_metric(labels, 1 if row.up else 0)
        if row.finished is not None and not starting:
            fam[FINISHED.name].add_metric(labels, 1 if row.finished else 0)
        _add_exit(fam, row)  # how its process ended, if it ended without finishing
        if row.stop is not None:
            fam[STOP_REQUESTED.name].add_metric(labels, row.stop.requested)
        _add_job(fam, row)
        hb = row.heartbeat
        if hb is None:
            return  # a configured run that does not report: liveness is all we know
        if hb.step is not None:
            fam[STEP.name].add_metric(labels, hb.step)
        if hb.step_time is not None:
            fam[STEP_TIMESTAMP.name].add_metric(labels, hb.step_time)
        if hb.first_step is not None:
            fam[FIRST_STEP.name].add_metric(labels, hb.first_step)
        fam[HEARTBEAT_TIMESTAMP.name].add_metric(labels, hb.time)
        if not starting:
            fam[START_TIMESTAMP.name].add_metric(labels, hb.started)
        for spec, then in (
            (STEP_AGE, hb.step_time),
            (HEARTBEAT_AGE, hb.time),
            (START_AGE, None if starting else hb.started),
        ):
            if then:  # 0 is an unknown time: no age, never a huge one
                fam[spec.name].add_metric(labels, age(now, then))
        for name, value in sorted(hb.scalars.items()):
            fam[SCALAR.name].add_metric([*labels, name], value)
        _add_nonfinite(fam, labels, hb)
        _add_timing(fam, labels, hb)
        for a in hb.allocator:
            dev = [*labels, str(a.device)]
            fam[ALLOCATED.name].add_metric(dev, a.allocated_bytes)
            fam[RESERVED.name].add_metric(dev, a.reserved_bytes)
            fam[MAX_ALLOCATED.name].add_metric(dev, a.max_allocated_bytes)
            fam[INACTIVE_SPLIT.name].add_metric(dev, a.inactive_split_bytes)
            fam[ALLOC_RETRIES.name].add_metric(dev, a.alloc_retries)
            fam[OOMS.name].add_metric(dev, a.ooms)
            if a.total_bytes is not None:
                fam[DEVICE_TOTAL.name].add_metric(dev, a.total_bytes)
            if a.uuid is not None:
                fam[DEVICE_INFO.name].add_metric([*dev, a.uuid], 1)
        _add_stuck(fam, row)
        _add_snapshots(fam, labels, hb)

    def _deaths(self, fam: dict[str, Any], view: RunView, now: float) -> None:
        by_run: dict[str, list[Heartbeat]] = {}
        for row in view.rows:
            if row.heartbeat is not None:
                by_run.setdefault(row.run, []).append(row.heartbeat)
        for run, heartbeats in sorted(by_run.items()):
            # each rank counts the deaths of its own line of processes; one crash of an
            # 8-rank run is 8 records but one death, so the run's count is the largest
            fam[DEATHS.name].add_metric([run], max(hb.deaths for hb in heartbeats))
            last = last_death([d for hb in heartbeats for d in hb.death_history])
            if last is None:
                continue
            if last.step is not None:
                fam[LAST_DEATH_STEP.name].add_metric([run], last.step)
            fam[LAST_DEATH_TIMESTAMP.name].add_metric([run], last.time)
            if last.time:
                fam[LAST_DEATH_AGE.name].add_metric([run], age(now, last.time))
            fam[LAST_DEATH_INFO.name].add_metric([run, last.cause], 1)
            if last.xid is not None:
                fam[LAST_DEATH_XID.name].add_metric([run], last.xid)
            if last.job is not None:  # unknown in a death an older reporter recorded
                fam[LAST_DEATH_JOB.name].add_metric([run, last.job], 1)

    def _logs(self, fam: dict[str, Any], view: RunView, scrape: Scrape) -> None:
        for log in view.log_files:
            try:
                st = os.stat(log.path)
            except OSError as exc:
                if log.report_errors:
                    scrape.error(
                        f"run {log.run!r}: log file {log.path}: cannot stat: "
                        f"{exc.strerror or exc}; its age is unknown"
                    )
                continue
            refused = ownership_problem(st, log.owner, "file")
            if refused is not None:
                scrape.error(f"run {log.run!r}: log file {log.path}: {refused}")
                continue
            mtime_ns = st.st_mtime_ns
            if mtime_ns <= 0:
                # seen on NFS: an mtime of 0 is "unknown", never "very old"
                if log.report_errors:
                    scrape.error(
                        f"run {log.run!r}: log file {log.path}: modification time is 0 "
                        "(unknown); its age is not published"
                    )
                continue
            fam[LOG_MODIFIED.name].add_metric([log.run], mtime_ns / 1e9)


def _add_starting(fam: dict[str, Any], row: RunRow) -> bool:
    """Add the row's ``trainguard_run_starting`` series when it is starting; whether it is.

    While a rank is starting its ``process_up``, ``finished`` and start time are left out, so
    that no rule judges it on progress (no first step, stalled, log or checkpoint stale,
    goodput); this series says it is there.
    """
    if not starting(row):
        return False
    fam[STARTING.name].add_metric([row.run, row.rank], 1)
    return True


def _add_exit(fam: dict[str, Any], row: RunRow) -> None:
    """Add the row's ``trainguard_run_exit_info`` series, when its process ended unfinished."""
    ended = exit_of(row)
    if ended is not None:
        fam[EXIT_INFO.name].add_metric([row.run, row.rank, *ended], 1)


def _add_job(fam: dict[str, Any], row: RunRow) -> None:
    r"""The row's job series, when its heartbeat names a job.

    One exporter runs per node, so a job of many nodes is many Prometheus ``instance``\ s; this
    series carries what joins them (the job's id, the same on every node) and where the rank
    sits in it. The attempt (the launcher's restart count) is a value of its own, not a label:
    a label that changes at every restart would make a new series each time.
    """
    hb = row.heartbeat
    job = None if hb is None else hb.job
    if job is None:
        return
    node = "" if job.node_rank is None else str(job.node_rank)
    local = "" if job.local_rank is None else str(job.local_rank)
    fam[JOB_INFO.name].add_metric([row.run, row.rank, job.id, node, local, job.launcher], 1)
    if job.restart_count is not None:
        fam[JOB_ATTEMPT.name].add_metric([row.run, row.rank], job.restart_count)


def _add_stuck(fam: dict[str, Any], row: RunRow) -> None:
    """Add the row's stuck location, if its heartbeat has one and it still runs."""
    stuck = stuck_at(row)
    if stuck is not None:
        saving = "true" if stuck.saving else ""
        fam[STUCK_INFO.name].add_metric(
            [row.run, row.rank, stuck.where, stuck.collective or "", saving], 1
        )


def _add_nonfinite(fam: dict[str, Any], labels: list[str], hb: Heartbeat) -> None:
    """Add one rank's non-finite counts and loss streak.

    Absent for heartbeats of reporters older than the record. What "observed" means (one step
    per reporter wake-up) is in :mod:`trainguard.run.scalar_health` and docs/metrics.md.
    """
    record = hb.nonfinite
    if record is None:
        return
    for name, count in sorted(record.counts.items()):
        fam[NONFINITE.name].add_metric([*labels, name], count)
    fam[LOSS_STREAK.name].add_metric(labels, record.loss_streak)
    if record.loss_streak and record.loss_first_step is not None:
        fam[LOSS_FIRST_STEP.name].add_metric(labels, record.loss_first_step)
    if record.loss_last_finite_step is not None:
        fam[LOSS_LAST_FINITE_STEP.name].add_metric(labels, record.loss_last_finite_step)


def _add_timing(fam: dict[str, Any], labels: list[str], hb: Heartbeat) -> None:
    """Add the rank's data-wait and compute counters, when its heartbeat carries any.

    Counters that restart at 0 with each process of the rank, which ``rate()`` takes as a
    reset; how the rules use them to tell which rank is slow: docs/metrics.md#who-is-slow.
    """
    timing = hb.timing
    if timing is None:
        return
    fam[DATA_WAIT.name].add_metric(labels, timing.data_seconds)
    fam[COMPUTE.name].add_metric(labels, timing.compute_seconds)
    fam[TIMED_STEPS.name].add_metric(labels, timing.steps)


def _add_snapshots(fam: dict[str, Any], labels: list[str], hb: Heartbeat) -> None:
    """Add the heartbeat's snapshot counters, history flag and newest files (docs/snapshots.md).

    The reporter carries the counts across the run's restarts.
    """
    fam[SNAPSHOTS.name].add_metric(labels, hb.memory_snapshots)
    snaps = hb.snapshots
    if snaps is None:
        return
    for reason in SNAPSHOT_REASONS:
        fam[SNAPSHOT_DUMPS.name].add_metric([*labels, reason], snaps.counts.get(reason, 0))
        fam[SNAPSHOT_FAILURES.name].add_metric([*labels, reason], snaps.failures.get(reason, 0))
    if snaps.history is not None:
        fam[SNAPSHOT_HISTORY.name].add_metric(labels, 1 if snaps.history else 0)
    for rec in snaps.recent:
        step = "" if rec.step is None else str(rec.step)
        fam[SNAPSHOT_RECENT.name].add_metric([*labels, rec.reason, rec.file, step], rec.time)
