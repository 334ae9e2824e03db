"""Training runs: alive or gone, finished or not, progress, memory and recorded deaths.

The memory is the allocator's view; the deaths are those a restarted run recorded. Everything
comes from the shared run table (heartbeat files and the config file) at scrape time; see
docs/metrics.md for what each series means and when it is absent.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

from prometheus_client.core import Metric

from trainguard.exporter.collectors.runs.exit_rows import EXIT_INFO, add_exit
from trainguard.exporter.collectors.runs.job_rows import JOB_METRICS, add_job_rows
from trainguard.exporter.collectors.runs.nonfinite_series import METRICS as NONFINITE_METRICS
from trainguard.exporter.collectors.runs.nonfinite_series import add_nonfinite
from trainguard.exporter.collectors.runs.run_timing import METRICS as TIMING
from trainguard.exporter.collectors.runs.run_timing import add_timing
from trainguard.exporter.collectors.runs.snapshot_rows import SNAPSHOT_METRICS, add_snapshots
from trainguard.exporter.collectors.runs.starting_rows import STARTING, add_starting
from trainguard.exporter.collectors.runs.stuck_rows import STUCK_INFO, add_stuck
from trainguard.exporter.runs.deaths import age, last_death
from trainguard.exporter.runs.table import RunRow, RunTable, RunView
from trainguard.exporter.runs.targets import ownership_problem
from trainguard.exporter.scrape.collector import Collector, MetricSpec, Setup
from trainguard.exporter.scrape.context import Scrape
from trainguard.shared.heartbeat import Heartbeat

RR = ("run", "rank")
RUN_INFO = MetricSpec(
    "trainguard_run_info",
    "gauge",
    ("run", "rank", "host", "pid"),
    "Always 1 for each run and rank the exporter knows; host and pid of its (last) process.",
)
PROCESS_UP = MetricSpec(
    "trainguard_run_process_up",
    "gauge",
    RR,
    "1 if the run's process is alive (pid exists with the recorded start), 0 if gone.",
)
FINISHED = MetricSpec(
    "trainguard_run_finished",
    "gauge",
    RR,
    "1 if the run ended cleanly, 0 otherwise (running, failed, or died).",
)
STEP = MetricSpec("trainguard_run_step", "gauge", RR, "Last step the run reported.")
STEP_TIMESTAMP = MetricSpec(
    "trainguard_run_step_timestamp_seconds",
    "gauge",
    RR,
    "When the run last reported a step.",
)
HEARTBEAT_TIMESTAMP = MetricSpec(
    "trainguard_run_heartbeat_timestamp_seconds",
    "gauge",
    RR,
    "When the run's reporter last wrote its heartbeat.",
)
START_TIMESTAMP = MetricSpec(
    "trainguard_run_start_timestamp_seconds",
    "gauge",
    RR,
    "When the run's current (or last) process started reporting.",
)
# Ages, computed at scrape time against the exporter's clock. The exporter runs on the trainer's
# host, so both clocks are one: unlike time() - *_timestamp_seconds in PromQL, an age is not
# thrown off by skew between that host and Prometheus (WSL2 after sleep, an unsynced node).
STEP_AGE = MetricSpec(
    "trainguard_run_step_age_seconds",
    "gauge",
    RR,
    "Seconds since the run last reported a step, by this host's clock.",
)
HEARTBEAT_AGE = MetricSpec(
    "trainguard_run_heartbeat_age_seconds",
    "gauge",
    RR,
    "Seconds since the run's reporter last wrote its heartbeat, by this host's clock.",
)
START_AGE = MetricSpec(
    "trainguard_run_start_age_seconds",
    "gauge",
    RR,
    "Seconds since the run's current (or last) process started reporting, by this host's clock.",
)
LOG_MODIFIED = MetricSpec(
    "trainguard_run_log_modified_timestamp_seconds",
    "gauge",
    ("run",),
    "Modification time of the run's log file; absent when unknown.",
)
SCALAR = MetricSpec(
    "trainguard_run_scalar",
    "gauge",
    ("run", "rank", "name"),
    "Last value of a numeric scalar the run reported with step() (loss, tokens/s...).",
)
RRD = ("run", "rank", "device")
ALLOCATED = MetricSpec(
    "trainguard_run_allocator_allocated_bytes",
    "gauge",
    RRD,
    "Bytes the process's CUDA caching allocator has handed to tensors.",
)
RESERVED = MetricSpec(
    "trainguard_run_allocator_reserved_bytes",
    "gauge",
    RRD,
    "Bytes the process's CUDA caching allocator holds from the driver.",
)
MAX_ALLOCATED = MetricSpec(
    "trainguard_run_allocator_max_allocated_bytes",
    "gauge",
    RRD,
    "Peak of allocated bytes since the process started (or its peak stats were reset).",
)
INACTIVE_SPLIT = MetricSpec(
    "trainguard_run_allocator_inactive_split_bytes",
    "gauge",
    RRD,
    "Bytes in inactive, split blocks: reserved memory fragmentation keeps from large requests.",
)
ALLOC_RETRIES = MetricSpec(
    "trainguard_run_allocator_alloc_retries_total",
    "counter",
    RRD,
    "cudaMalloc calls that failed and were retried after freeing cached blocks.",
)
OOMS = MetricSpec(
    "trainguard_run_allocator_ooms_total",
    "counter",
    RRD,
    "Out-of-memory errors the allocator raised.",
)
DEVICE_TOTAL = MetricSpec(
    "trainguard_run_allocator_device_total_bytes",
    "gauge",
    RRD,
    "Total memory of the CUDA device as the process sees it (torch's total_memory).",
)
DEVICE_INFO = MetricSpec(
    "trainguard_run_allocator_device_info",
    "gauge",
    ("run", "rank", "device", "uuid"),
    "Always 1 for each allocator device whose GPU is known; uuid is the GPU's (as in "
    "trainguard_gpu_info), to join the allocator's bytes to the driver's view of that GPU.",
)
DEATHS = MetricSpec(
    "trainguard_run_deaths_total",
    "counter",
    ("run",),
    "Times a process of the run went away without finishing, as recorded when it restarted.",
)
LAST_DEATH_STEP = MetricSpec(
    "trainguard_run_last_death_step",
    "gauge",
    ("run",),
    "Step the run had reached when it last died.",
)
LAST_DEATH_TIMESTAMP = MetricSpec(
    "trainguard_run_last_death_timestamp_seconds",
    "gauge",
    ("run",),
    "Last heartbeat of the process that died last: the latest it is known to have been alive.",
)
LAST_DEATH_AGE = MetricSpec(
    "trainguard_run_last_death_age_seconds",
    "gauge",
    ("run",),
    "Seconds since the last heartbeat of the process that died last, by this host's clock.",
)
LAST_DEATH_INFO = MetricSpec(
    "trainguard_run_last_death_info",
    "gauge",
    ("run", "cause"),
    "Always 1; cause of the run's last death: reboot, oom_killer, gpu_xid, exception, signal, "
    "time_limit or unknown.",
)
LAST_DEATH_XID = MetricSpec(
    "trainguard_run_last_death_xid",
    "gauge",
    ("run",),
    "NVIDIA Xid code of the GPU error the kernel logged around the run's last death.",
)
HEARTBEAT_FILES = MetricSpec(
    "trainguard_heartbeat_files",
    "gauge",
    (),
    "Heartbeat files in the state directory that were read and valid in this scrape.",
)
HEARTBEAT_FILE_ERRORS = MetricSpec(
    "trainguard_heartbeat_file_errors",
    "gauge",
    (),
    "Heartbeat files in the state directory that could not be used in this scrape.",
)


class RunsCollector(Collector):
    name = "runs"
    help = "training runs, from heartbeat files and the config file"
    metrics = (
        RUN_INFO,
        PROCESS_UP,
        FINISHED,
        EXIT_INFO,
        STEP,
        STEP_TIMESTAMP,
        HEARTBEAT_TIMESTAMP,
        START_TIMESTAMP,
        STEP_AGE,
        HEARTBEAT_AGE,
        START_AGE,
        LOG_MODIFIED,
        SCALAR,
        *NONFINITE_METRICS,
        *TIMING,
        ALLOCATED,
        RESERVED,
        MAX_ALLOCATED,
        INACTIVE_SPLIT,
        ALLOC_RETRIES,
        OOMS,
        DEVICE_TOTAL,
        DEVICE_INFO,
        *SNAPSHOT_METRICS,
        DEATHS,
        LAST_DEATH_STEP,
        LAST_DEATH_TIMESTAMP,
        LAST_DEATH_AGE,
        LAST_DEATH_INFO,
        LAST_DEATH_XID,
        HEARTBEAT_FILES,
        HEARTBEAT_FILE_ERRORS,
        STUCK_INFO,
        *JOB_METRICS,
        STARTING,
    )

    @classmethod
    def build(cls, setup: Setup) -> RunsCollector:
        collector = cls(setup.table)
        collector.shared_reads = (setup.table.view,)
        return collector

    def __init__(self, table: RunTable) -> None:
        self._table = table

    def gather(self, scrape: Scrape) -> Iterable[Metric]:
        view = self._table.view(scrape)
        for message in view.errors:
            scrape.error(message)
        fam: dict[str, Any] = {spec.name: spec.family() for spec in self.metrics}
        now = time.time()  # after the view was read: every age is >= 0 on one clock
        for row in view.rows:
            self._row(fam, row, now)
        self._deaths(fam, view, now)
        self._logs(fam, view, scrape)
        fam[HEARTBEAT_FILES.name].add_metric([], view.files_ok)
        fam[HEARTBEAT_FILE_ERRORS.name].add_metric([], view.file_errors)
        return fam.values()

    def _row(self, fam: dict[str, Any], row: RunRow, now: float) -> None:
        labels = [row.run, row.rank]
        pid = "" if row.pid is None else str(row.pid)
        fam[RUN_INFO.name].add_metric([row.run, row.rank, row.host, pid], 1)
        starting = add_starting(fam, row)  # alive, not training yet: not judged on progress
        if row.up is not None and not starting:
            fam[PROCESS_UP.name].add_metric(labels, 1 if row.up else 0)
        if row.finished is not None and not starting:
            fam[FINISHED.name].add_metric(labels, 1 if row.finished else 0)
        add_exit(fam, row)  # how its process ended, if it ended without finishing
        add_job_rows(fam, row)
        hb = row.heartbeat
        if hb is None:
            return  # a configured run that does not report: liveness is all we know
        if hb.step is not None:
            fam[STEP.name].add_metric(labels, hb.step)
        if hb.step_time is not None:
            fam[STEP_TIMESTAMP.name].add_metric(labels, hb.step_time)
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
        add_nonfinite(fam, labels, hb)
        add_timing(fam, labels, hb)
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
        add_stuck(fam, row)
        add_snapshots(fam, labels, hb)

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
