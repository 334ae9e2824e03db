"""The runs collector's series: names, types, labels and help, in docs/metrics.md's order.

The one place a runs metric is defined: docs/metrics.md is checked against these
(tests/generators/test_metrics_doc.py), and the collector serves its families in this order.
"""

from __future__ import annotations

from trainguard.exporter.scrape.collector import MetricSpec

RR = ("run", "rank")
RRD = ("run", "rank", "device")
RUN_INFO = MetricSpec(
    "trainguard_run_info",
    "gauge",
    ("run", "rank", "host", "pid"),
    "Always 1 for each run and rank the exporter knows; host and pid of its (last) process.",
)
JOB_INFO = MetricSpec(
    "trainguard_run_job_info",
    "gauge",
    ("run", "rank", "job_id", "node_rank", "local_rank", "launcher"),
    "Always 1 for each run and rank whose process told its job (torchrun, Slurm, Kubernetes, "
    "MPI or Run(job=...)): job_id is the same on every node of the job; node_rank and "
    "local_rank are empty when the launcher does not say.",
)
JOB_ATTEMPT = MetricSpec(
    "trainguard_run_job_attempt",
    "gauge",
    ("run", "rank"),
    "The attempt of the job this run and rank's (last) process belongs to: the launcher's "
    "restart count (torchrun's TORCHELASTIC_RESTART_COUNT, Slurm's SLURM_RESTART_COUNT; 0 for "
    "a Slurm job never requeued); absent when the launcher does not say.",
)
PROCESS_UP = MetricSpec(
    "trainguard_run_process_up",
    "gauge",
    RR,
    "1 if the run's process is alive (pid exists with the recorded start), 0 if gone.",
)
STARTING = MetricSpec(
    "trainguard_run_starting",
    "gauge",
    ("run", "rank"),
    "Always 1 for a rank whose live process has not begun training (set-up, checkpoint loading, "
    "or only evaluating); its process_up, finished and start time are absent meanwhile.",
)
FINISHED = MetricSpec(
    "trainguard_run_finished",
    "gauge",
    RR,
    "1 if the run ended cleanly, 0 otherwise (running, failed, or died).",
)
EXIT_INFO = MetricSpec(
    "trainguard_run_exit_info",
    "gauge",
    ("run", "rank", "cause", "signal"),
    "Always 1 for a rank whose process ended without finishing; cause: on_purpose (trainguard "
    "stop), signal, time_limit, exception or unknown; signal: the signal's name, or empty.",
)
STOP_REQUESTED = MetricSpec(
    "trainguard_run_stop_requested_timestamp_seconds",
    "gauge",
    RR,
    "When trainguard stop asked this rank's current process to stop (its host's clock).",
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
NONFINITE = MetricSpec(
    "trainguard_run_scalar_nonfinite_total",
    "counter",
    ("run", "rank", "name"),
    "Steps the reporter observed (at most one per writer interval) whose scalar was NaN or "
    "infinite; per process (restarts from 0).",
)
LOSS_STREAK = MetricSpec(
    "trainguard_run_loss_nonfinite_streak",
    "gauge",
    ("run", "rank"),
    "Consecutive observed steps, up to the latest, whose loss was NaN or infinite; 0 once a "
    "finite loss is reported.",
)
LOSS_FIRST_STEP = MetricSpec(
    "trainguard_run_loss_nonfinite_first_step",
    "gauge",
    ("run", "rank"),
    "Step of the first observed step of the current non-finite loss streak: the loss turned "
    "non-finite after trainguard_run_loss_last_finite_step and at or before this step; absent "
    "while the loss is finite.",
)
LOSS_LAST_FINITE_STEP = MetricSpec(
    "trainguard_run_loss_last_finite_step",
    "gauge",
    ("run", "rank"),
    "Step of the newest observed step whose loss was finite; absent before the first.",
)
STUCK_INFO = MetricSpec(
    "trainguard_run_stuck_info",
    "gauge",
    ("run", "rank", "where", "collective", "saving"),
    "1 while a rank's step is overdue and its reporter sampled where its main thread is: "
    "where is the user's innermost frames, collective the torch.distributed function it "
    "waits in (empty when none), saving true inside a checkpoint save (empty otherwise).",
)
DATA_WAIT = MetricSpec(
    "trainguard_run_data_wait_seconds_total",
    "counter",
    RR,
    "Seconds the rank's current process waited for its next batch, summed over its timed steps.",
)
COMPUTE = MetricSpec(
    "trainguard_run_compute_seconds_total",
    "counter",
    RR,
    "Seconds the rank's current process computed before the gradient all-reduce, summed over "
    "its timed steps.",
)
TIMED_STEPS = MetricSpec(
    "trainguard_run_timed_steps_total",
    "counter",
    RR,
    "Steps of the rank's current process that carried a data or compute duration.",
)
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
SNAPSHOTS = MetricSpec(
    "trainguard_run_memory_snapshots_total",
    "counter",
    RR,
    "CUDA memory snapshots dumped at an OOM (carried across restarts of the run).",
)
SNAPSHOT_DUMPS = MetricSpec(
    "trainguard_run_memory_snapshot_dumps_total",
    "counter",
    ("run", "rank", "reason"),
    "CUDA memory snapshots written, by reason: oom, periodic, requested (carried across "
    "restarts of the run).",
)
SNAPSHOT_FAILURES = MetricSpec(
    "trainguard_run_memory_snapshot_failures_total",
    "counter",
    ("run", "rank", "reason"),
    "CUDA memory snapshots that could not be taken (no CUDA, no snapshot API, disk full), by "
    "reason; training went on.",
)
SNAPSHOT_HISTORY = MetricSpec(
    "trainguard_run_memory_history_recording",
    "gauge",
    RR,
    "1 if torch records the CUDA allocation history the run's snapshots show, 0 if it could "
    "not start recording.",
)
SNAPSHOT_RECENT = MetricSpec(
    "trainguard_run_memory_snapshot_timestamp_seconds",
    "gauge",
    ("run", "rank", "reason", "file", "step"),
    "When each of the run's newest memory snapshots was written; file is its name in the "
    "state directory.",
)
DEATHS = MetricSpec(
    "trainguard_run_deaths_total",
    "counter",
    ("run",),
    "Times a process of the run went away without finishing, as recorded when it restarted.",
)
FIRST_STEP = MetricSpec(
    "trainguard_run_first_step",
    "gauge",
    ("run", "rank"),
    "First step this process reported: after a restart, the step it resumed at "
    "(TrainingProcessRestarted's steps lost are the death's step minus the one before it).",
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
LAST_DEATH_JOB = MetricSpec(
    "trainguard_run_last_death_job_info",
    "gauge",
    ("run", "job_id"),
    "Always 1; the job the process that died last belonged to (job_id empty: none). A run "
    "relaunched under a new job id records the old job's death: the new job was not restarted.",
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
HEARTBEAT_FILE_INVALID = MetricSpec(
    "trainguard_heartbeat_file_invalid",
    "gauge",
    ("file",),
    "1 per heartbeat file that could not be used in this scrape (why is logged once); the run "
    "it held is kept from its last valid reading. At most 100 files.",
)
STATE_DIR_PRESENT = MetricSpec(
    "trainguard_state_dir_present",
    "gauge",
    ("path",),
    "1 if the state directory exists and could be listed, 0 if not: no training run can be "
    "watched (a typo in --state.dir, or it was removed).",
)

METRICS = (
    RUN_INFO,
    JOB_INFO,
    JOB_ATTEMPT,
    PROCESS_UP,
    STARTING,
    FINISHED,
    EXIT_INFO,
    STOP_REQUESTED,
    STEP,
    STEP_TIMESTAMP,
    HEARTBEAT_TIMESTAMP,
    START_TIMESTAMP,
    STEP_AGE,
    HEARTBEAT_AGE,
    START_AGE,
    LOG_MODIFIED,
    SCALAR,
    NONFINITE,
    LOSS_STREAK,
    LOSS_FIRST_STEP,
    LOSS_LAST_FINITE_STEP,
    STUCK_INFO,
    DATA_WAIT,
    COMPUTE,
    TIMED_STEPS,
    ALLOCATED,
    RESERVED,
    MAX_ALLOCATED,
    INACTIVE_SPLIT,
    ALLOC_RETRIES,
    OOMS,
    DEVICE_TOTAL,
    DEVICE_INFO,
    SNAPSHOTS,
    SNAPSHOT_DUMPS,
    SNAPSHOT_FAILURES,
    SNAPSHOT_HISTORY,
    SNAPSHOT_RECENT,
    DEATHS,
    LAST_DEATH_STEP,
    FIRST_STEP,
    LAST_DEATH_TIMESTAMP,
    LAST_DEATH_AGE,
    LAST_DEATH_INFO,
    LAST_DEATH_XID,
    LAST_DEATH_JOB,
    HEARTBEAT_FILES,
    HEARTBEAT_FILE_ERRORS,
    HEARTBEAT_FILE_INVALID,
    STATE_DIR_PRESENT,
)
