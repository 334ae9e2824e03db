"""Jobs of many ranks over many nodes: one page per job, naming the rank that died first.

TrainingJobRankDied (a rank of a job is gone: one page for the whole job, whatever the number
of nodes), TrainingJobTerminated (the job's ranks were stopped by a signal: a preemption, a
time limit; one warning for the job), TrainingJobRestarted (the launcher restarted the job's
ranks: one notice per restart, for a death of this job, not of an older job of the same run
whose death the relaunched ranks recorded).

A job's ranks are those with the same ``job_id`` in ``trainguard_run_job_info``; each node has
its own exporter (``instance``), so these rules aggregate by the target labels without
``instance`` (``${target_labels_across}``), the run and the job. The ranks of a job are left
out of the per-node TrainingProcessDied and TrainingProcessRestarted (``alerts/rules/runs.py``,
``deaths.py``): a 16-node job that loses a rank pages once, not sixteen times.

A job moves (a Slurm requeue onto other nodes, an elastic restart, a resume under a new job id),
and the heartbeats its ranks left on the nodes it left outlive it there. The ranks of a job's
older attempt are history, never a death of the job: a rank whose attempt
(``trainguard_run_job_attempt``, the launcher's restart count) is below the newest attempt any
exporter publishes for the job, and every rank of a job that is not stepping while another job
of the same run steps (a resume under a new job id). What stays is the job's truth: its newest
attempt across every node.

A job's death holds while an exporter is down: the ranks last seen on an exporter that has
been down for ``exporter_down_for`` (a node lost, or rebooting, with its exporter), running or
dead when last seen, are dead ranks of their job unless the job steps on without them (an
elastic job that renumbered its survivors). Such a rank is named first: a node lost is what
stops the others. The page goes out ``job_death_for`` after the first death, long before
``exporter_down_for`` when a peer's collective failed at once: a rank last seen running on an
exporter that has answered no scrape since (for ``job_death_for``) is named first then too.

The rank that died first: a rank lost with its node, else the dead rank whose last heartbeat is
the oldest, on one clock for every node: Prometheus' (the time of the scrape that read the
rank's heartbeat age, minus that age, which the exporter measures on the trainer's own clock),
never the hosts' clocks against each other (a host 50 minutes behind would name its rank).
Ranks that raise because a peer died (a collective's connection closed) and the ranks the
launcher stops with SIGTERM after a death write their final heartbeat after it, so the rank
that died on its own has the oldest, whatever its cause: a rank evicted (SIGTERM from outside
the job) before its peers failed is named, with its signal as the cause.

Longer than 400 lines because the job's truth (its attempts, the ranks that are history, the
ranks lost with their node) must be recorded in this group, so that its alerts read them at the
same evaluation: Prometheus evaluates groups independently, and a record of another group is up
to an interval late.
"""

from __future__ import annotations

from alerts.kinds import DURATION, Threshold
from alerts.rules.common import NO_CHECKPOINT, Alert, Group, Record, query_value
from alerts.rules.recording import ON_PURPOSE, STATE, TARGET_DOWN, last_seen
from alerts.rules.signals import STOPPED

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "job_death_for",
        "2m",
        DURATION,
        "TrainingJobRankDied: a rank of a job has been dead this long before the job's page "
        "goes out. Longer than a launcher's restart in place, so that the normal recovery is a "
        "TrainingJobRestarted notice, not a critical page: torchrun --max-restarts re-runs its "
        "rendezvous across the nodes (up to its 30 s last call in an elastic job), then the "
        "restarted ranks import their libraries and write a heartbeat, which one scrape and one "
        "evaluation (15 s each by default) bring to the rules. Also at least two scrape "
        "intervals, so that every node's exporter has been heard and the page names the rank "
        "that died first.",
    ),
    Threshold(
        "job_terminated_for",
        "5m",
        DURATION,
        "TrainingJobTerminated: a job's ranks have been stopped by a signal this long, with no "
        "newer attempt of the job, before it warns. A requeue (Slurm's scontrol requeue, a "
        "preempted job put back in the queue, a rescheduled pod) that starts the job again "
        "within it is a restart, not a stop; Slurm holds a requeued job for about two minutes.",
    ),
    Threshold(
        "job_superseded_step_age",
        "5m",
        DURATION,
        "A job that is not stepping is superseded by another job of the same run (a resume "
        "under a new job id) while a rank of that one stepped within this long, by its host's "
        "clock: the old job's ranks are history, no longer paged as deaths.",
    ),
)

#: each rank's attempt of its job, with the job's id
ATTEMPT = "job_rank:trainguard_run_job_attempt:job_info"
#: the newest attempt of each job, across every node's exporter
NEWEST_ATTEMPT = "job:trainguard_run_job_attempt:max"
#: the jobs with a live rank that stepped within job_superseded_step_age
JOB_STEPPING = "job:trainguard_run_stepping_recently:present"
#: the ranks that are a job's history: an older attempt of their job, or a job superseded by
#: another job of the same run that steps while it does not
HISTORY = "job_rank:trainguard_run_superseded:job_info"
#: the ranks of a job last seen on an exporter that has been down for exporter_down_for (a node
#: lost with its exporter, a rebooting node), valued 1 when they were running when last seen and 0
#: when already dead: their series went stale with the exporter, their last values are what is
#: known
LOST = "job_rank:trainguard_run_lost:job_info"
#: the ranks of a job last seen running on an exporter that has answered no scrape for
#: job_death_for, though not yet for exporter_down_for: valued 1. Not yet dead ranks of their job
#: (LOST is, once it is sure), but when a peer died meanwhile (its collective failed) the page,
#: which goes out job_death_for after that death, names the rank that vanished with its node
SILENT = "job_rank:trainguard_run_silent:job_info"
#: the job's ranks that are gone without a clean exit: their job_info series
DEAD = "job_rank:trainguard_run_dead:job_info"
#: the job's rank that died first (see the module's docstring), valued its last heartbeat on
#: Prometheus' clock
FIRST = "job_rank:trainguard_run_first_death:heartbeat_timestamp"

ON_RANK = "on (${target_labels}, run, rank)"
#: an annotation query's selector of the alert's job, and its printf arguments
JOB_SEL = "${target_labels_across_sel},run=%q,job_id=%q"
JOB_ARGS = "${target_labels_across_args} $labels.run $labels.job_id"
#: the same for a run's series across the job's nodes (checkpoints are per run, not rank)
RUN_SEL = "${target_labels_across_sel},run=%q"
RUN_ARGS = "${target_labels_across_args} $labels.run"

_JOB_STEP = "max(trainguard_run_step and " + ON_RANK + " trainguard_run_job_info{" + JOB_SEL + "})"
_JOB_CHECKPOINT = "max(trainguard_checkpoint_last_step{" + RUN_SEL + ',location="primary"})'
#: the job's ranks that ended on a signal they caught (their exit info)
_STOPPED_RANKS = (
    "trainguard_run_exit_info{"
    + RUN_SEL
    + ',cause=~"signal|time_limit"} and '
    + ON_RANK
    + " trainguard_run_job_info{"
    + JOB_SEL
    + "}"
)


def _first(query: str, label: str) -> str:
    """Template text printing ``label`` of the first sample of ``query`` (about the job)."""
    return (
        "{{ with printf `" + query + "` " + JOB_ARGS + " | query }}"
        '{{ . | first | label "' + label + '" }}{{ else }}unknown{{ end }}'
    )


#: the cause of the first sample of a query: "oom_killer", "signal SIGTERM"
_CAUSE = '{{ . | first | label "cause" }}{{ with . | first | label "signal" }} {{ . }}{{ end }}'


def _with_first(series: str, then: str) -> str:
    """Template text opening a ``with``: ``then`` where ``series`` has the job's first death.

    Inside ``then``, ``.`` is the samples; the caller writes the ``else`` and the ``end``.
    """
    return (
        "{{ with printf `"
        + series
        + " and "
        + ON_RANK
        + " "
        + FIRST
        + "{"
        + JOB_SEL
        + "}` "
        + JOB_ARGS
        + " | query }}"
        + then
    )


#: what every alert about a job says (deploy/trainguard.tmpl prints them): the job's step (its
#: ranks step together), the run's newest complete checkpoint on any of the job's nodes, and
#: the steps between them
JOB_CONTEXT = {
    "step": query_value(_JOB_STEP, JOB_ARGS, unknown="none reported yet"),
    "checkpoint_step": query_value(_JOB_CHECKPOINT, RUN_ARGS, unknown="none"),
    "steps_at_risk": query_value(
        "clamp_min(" + _JOB_STEP + " - " + _JOB_CHECKPOINT + ", 0)",
        JOB_ARGS + " " + RUN_ARGS,
        unknown="{{ with printf `"
        + _JOB_STEP
        + "` "
        + JOB_ARGS
        + " | query }}"
        + NO_CHECKPOINT
        + "{{ else }}unknown{{ end }}",
    ),
}


def _job_deaths(plus: str, window: str) -> str:
    """Template text: the deaths the job's ranks recorded, ``plus`` an expression, else 1.

    Each restart of the job is one more on every rank (recorded by the restarted process), the
    largest over ``window`` so that a missed scrape does not change it.
    """
    return (
        "{{ with printf `max(last_over_time(trainguard_run_deaths_total{"
        + RUN_SEL
        + "}["
        + window
        + "]) and on (${target_labels}, run) trainguard_run_job_info{"
        + JOB_SEL
        + "})"
        + plus
        + "` "
        + RUN_ARGS
        + " "
        + JOB_ARGS
        + ' | query }}{{ . | first | value | printf "%.0f" }}{{ else }}1{{ end }}'
    )


#: TrainingJobRestarted's ``restart`` label: each restart is its own alert, hence its own notice.
#: Annotations do not see templated labels: they print the same query.
RESTARTS = _job_deaths("", "${keep_firing_for}")
#: TrainingJobRankDied's ``death`` label: which of the job's deaths this is (the one not yet
#: counted by a restart), so that a job that dies again while the page of its previous death is
#: held (keep_firing_for) is notified again, as TrainingProcessDied's ``death`` does per node;
#: over exporter_down_active_lookback, so the page held while an exporter is down keeps it
JOB_DEATH = _job_deaths(" + 1", "${exporter_down_active_lookback}")

SNIPPETS = {
    # PromQL: the join on a rank, the dead ranks of jobs, the ranks stopped by a signal
    "on_rank": ON_RANK,
    "history": HISTORY,
    "lost": LOST,
    "silent": SILENT,
    "dead": DEAD,
    "job_info_last_seen": last_seen("trainguard_run_job_info"),
    "state_last_seen": last_seen(STATE),
    "state": STATE,
    "target_down": TARGET_DOWN,
    "stopped": STOPPED,
    "on_purpose": ON_PURPOSE,
    "restarts": RESTARTS,
    "attempt": ATTEMPT,
    "newest_attempt": NEWEST_ATTEMPT,
    "job_stepping": JOB_STEPPING,
    "first_rank": _first(FIRST + "{" + JOB_SEL + "}", "rank"),
    "first_instance": _first(FIRST + "{" + JOB_SEL + "}", "instance"),
    # the host of a rank on an exporter that is down too: its last trainguard_run_info
    "first_host": _first(
        "last_over_time(trainguard_run_info[${exporter_down_active_lookback}]) and "
        + ON_RANK
        + " "
        + FIRST
        + "{"
        + JOB_SEL
        + "}",
        "host",
    ),
    # "node lost" for a rank of an exporter that is down; "oom_killer", "signal SIGTERM": from
    # the signal handler's exit info; unknown without it
    "first_cause": (
        _with_first(LOST + " == 1", "node lost (its exporter is down){{ else }}")
        + _with_first(SILENT, "node lost (its exporter stopped answering){{ else }}")
        + _with_first("trainguard_run_exit_info", _CAUSE + "{{ else }}")
        + _with_first(
            "last_over_time(trainguard_run_exit_info[${exporter_down_active_lookback}])",
            _CAUSE + "{{ else }}unknown{{ end }}",
        )
        + "{{ end }}{{ end }}{{ end }}"
    ),
    # the ranks of the job's newest attempt, wherever they run (not its history), those of an
    # exporter that stopped answering included
    "job_ranks": query_value(
        "count(trainguard_run_job_info{"
        + JOB_SEL
        + "} unless "
        + ON_RANK
        + " "
        + HISTORY
        + " or "
        + LOST
        + "{"
        + JOB_SEL
        + "} or "
        + SILENT
        + "{"
        + JOB_SEL
        + "})",
        JOB_ARGS + " " + JOB_ARGS + " " + JOB_ARGS,
    ),
    "dead_nodes": query_value(
        "count(count by (${target_labels}) (" + DEAD + "{" + JOB_SEL + "}))", JOB_ARGS
    ),
    # the ranks stopped by a signal after the first death (the first, evicted, is not one)
    "by_signal": query_value(
        "count("
        + DEAD
        + "{"
        + JOB_SEL
        + "} and "
        + ON_RANK
        + ' trainguard_run_exit_info{cause="signal"} unless '
        + ON_RANK
        + " "
        + FIRST
        + ")",
        JOB_ARGS,
        unknown="0",
    ),
    # "oom_killer on 1 node(s), exception on 3 node(s)": each node's last recorded death
    "restart_causes": (
        "{{ range $i, $s := printf `count by (${target_labels_across}, run, cause) ("
        + "trainguard_run_last_death_info{"
        + RUN_SEL
        + "} and on (${target_labels}, run) trainguard_run_job_info{"
        + JOB_SEL
        + "})` "
        + RUN_ARGS
        + " "
        + JOB_ARGS
        + ' | query | sortByLabel "cause" }}{{ if $i }}, {{ end }}{{ $s.Labels.cause }} on '
        "{{ $s.Value }} node(s){{ end }}"
    ),
    # "4 SIGTERM (signal)": the signals that stopped the job's ranks, and why
    "terminated_by": (
        "{{ range $i, $s := printf `count by (${target_labels_across}, run, signal, cause) ("
        + _STOPPED_RANKS
        + ")` "
        + RUN_ARGS
        + " "
        + JOB_ARGS
        + ' | query | sortByLabel "signal" }}{{ if $i }}, {{ end }}{{ $s.Value }} '
        "{{ $s.Labels.signal }} ({{ $s.Labels.cause }}){{ end }}"
    ),
    "terminated_nodes": query_value(
        "count(count by (${target_labels}) (" + _STOPPED_RANKS + "))",
        RUN_ARGS + " " + JOB_ARGS,
    ),
    "restart_step": query_value(
        "max(trainguard_run_last_death_step{"
        + RUN_SEL
        + "} and on (${target_labels}, run) trainguard_run_job_info{"
        + JOB_SEL
        + "})",
        RUN_ARGS + " " + JOB_ARGS,
    ),
}

GROUP = Group(
    "trainguard-jobs",
    snippets=SNIPPETS,
    rules=(
        Record(
            ATTEMPT,
            """
            trainguard_run_job_attempt
            * ${on_rank} group_left (job_id) trainguard_run_job_info
            """,
        ),
        Record(NEWEST_ATTEMPT, "max by (${target_labels_across}, run, job_id) (${attempt})"),
        Record(
            JOB_STEPPING,
            """
            max by (${target_labels_across}, run, job_id) (
              trainguard_run_job_info
              and ${on_rank} trainguard_run_step_age_seconds < ${job_superseded_step_age_s}
              and ${on_rank} trainguard_run_process_up == 1
            ) * 0 + 1
            """,
        ),
        Record(
            HISTORY,
            """
            trainguard_run_job_info
            and ${on_rank} (
              ${attempt}
              < on (${target_labels_across}, run, job_id) group_left ()
              ${newest_attempt}
            )
            or (
              trainguard_run_job_info
              unless on (${target_labels_across}, run, job_id) ${job_stepping}
            )
            and on (${target_labels_across}, run) ${job_stepping}
            """,
        ),
        # valued the rank's last-seen state: 1 running (lost with its node), 0 already dead
        Record(
            LOST,
            """
            ${job_info_last_seen}
            * ${on_rank} group_left () ((${state_last_seen}) < 2)
            and on (${target_labels}) ${target_down}
            """,
        ),
        Record(
            SILENT,
            """
            last_over_time(trainguard_run_job_info[${exporter_down_for}])
            * ${on_rank} group_left () (last_over_time(${state}[${exporter_down_for}]) == 1)
            and on (${target_labels})
            max by (${target_labels}) (max_over_time(up{${job_selector}}[${job_death_for}])) == 0
            """,
        ),
        Record(
            DEAD,
            """
            trainguard_run_job_info
            and ${on_rank} trainguard_run_process_up == 0
            unless ${on_rank} trainguard_run_finished == 1
            unless ${on_rank} ${on_purpose}
            unless ${on_rank} ${history}
            or
            ${lost} unless on (${target_labels_across}, run, job_id) ${job_stepping}
            """,
        ),
        Record(
            FIRST,
            """
            bottomk by (${target_labels_across}, run, job_id) (1, ${dead} and ${on_rank} ${lost})
            or on (${target_labels_across}, run, job_id)
            bottomk by (${target_labels_across}, run, job_id) (
              1, ${silent} and on (${target_labels_across}, run, job_id) ${dead}
            )
            or on (${target_labels_across}, run, job_id)
            bottomk by (${target_labels_across}, run, job_id) (
              1,
              (
                timestamp(trainguard_run_heartbeat_age_seconds)
                - trainguard_run_heartbeat_age_seconds
              )
              * ${on_rank} group_left (job_id) ${dead}
            )
            """,
        ),
        Alert(
            "TrainingJobRankDied",
            "critical",
            # not while every dead rank was stopped by a signal within terminated_restart_window
            # (a preempted or time-limited job: TrainingProcessTerminated's warning)
            expr="""
            count by (${target_labels_across}, run, job_id) (${dead})
            unless on (${target_labels_across}, run, job_id) (
              count by (${target_labels_across}, run, job_id) (${dead})
              == count by (${target_labels_across}, run, job_id) (
                ${dead} and on (${target_labels}, run, rank) (
                  ${stopped}
                )
              )
            )
            """,
            for_="${job_death_for}",
            keep_firing_for="${keep_firing_for}",
            labels={"death": JOB_DEATH},
            summary="""
            Job {{ $labels.job_id }} of run {{ $labels.run }}: rank ${first_rank} on
            ${first_host} died first (cause: ${first_cause}).
            """,
            description="""
            {{ $value }} of the ${job_ranks} rank(s) of job {{ $labels.job_id }} (run
            {{ $labels.run }}) are gone without a clean exit, on ${dead_nodes} node(s). The
            first to die: rank ${first_rank} on ${first_host} (exporter ${first_instance}),
            cause: ${first_cause}. ${by_signal} rank(s) were stopped by a signal, the
            launcher's teardown after it: counted here, not paged on their own.
            """,
            annotations={
                **JOB_CONTEXT,
                "first_rank": "${first_rank}",
                "first_host": "${first_host}",
                "first_instance": "${first_instance}",
                "first_cause": "${first_cause}",
            },
        ),
        # As TrainingProcessTerminated (signals.py) judges a node's ranks, for a job's ranks
        # across its nodes: a preempted or time-limited job warns once, not once per node
        Alert(
            "TrainingJobTerminated",
            "warning",
            expr="""
            count by (${target_labels_across}, run, job_id) (
              trainguard_run_job_info
              unless ${on_rank} ${history}
              and on (${target_labels}, run, rank) (
                ${stopped}
              )
            )
            # a rank of the job that died otherwise, on any node: TrainingJobRankDied pages
            unless on (${target_labels_across}, run, job_id) (
              ${dead}
              unless on (${target_labels}, run, rank)
                trainguard_run_exit_info{cause=~"signal|time_limit"}
            )
            """,
            for_="${job_terminated_for}",
            keep_firing_for="${keep_firing_for}",
            summary="""
            Job {{ $labels.job_id }} of run {{ $labels.run }} was stopped by a signal.
            """,
            description="""
            {{ $value }} of the ${job_ranks} rank(s) of job {{ $labels.job_id }} (run
            {{ $labels.run }}), on ${terminated_nodes} node(s), ended on a signal they caught:
            ${terminated_by}. A scheduler's stop (time_limit: at the job's end time; signal:
            scancel, a preemption, pods deleted or evicted) rather than a crash. Not restarted
            within ${terminated_restart_window} of their last heartbeat, TrainingJobRankDied
            pages for the job.
            """,
            annotations=JOB_CONTEXT,
        ),
        # A death recorded by the job's restarted ranks less than restart_window ago, or one
        # Prometheus saw the count of within it (as TrainingProcessRestarted, per job).
        Alert(
            "TrainingJobRestarted",
            "warning",
            # ...of this job: a run relaunched under a new job id records the old job's death
            # on the nodes it reuses (trainguard_run_last_death_job_info names that job), and
            # the new job was never restarted
            expr="""
            max by (${target_labels_across}, run, job_id) (
              (
                trainguard_run_job_info
                and on (${target_labels}, run, job_id) trainguard_run_last_death_job_info
              )
              * on (${target_labels}, run) group_left ()
              (
                max by (${target_labels}, run) (
                  trainguard_run_last_death_age_seconds < ${restart_window_s}
                )
                or
                (
                  max by (${target_labels}, run) (trainguard_run_deaths_total)
                  > max by (${target_labels}, run) (
                    trainguard_run_deaths_total offset ${restart_window}
                  )
                )
              )
            )
            """,
            keep_firing_for="${keep_firing_for}",
            labels={"restart": RESTARTS},
            summary="""
            Job {{ $labels.job_id }} of run {{ $labels.run }} was restarted (restart
            ${restarts}).
            """,
            description="""
            Ranks of job {{ $labels.job_id }} (run {{ $labels.run }}) died without a clean
            exit less than ${restart_window} ago and were started again, by the launcher
            (torchrun --max-restarts, a Slurm requeue, a pod restart): the death may never
            have paged. Last recorded deaths: ${restart_causes}; step reached before it:
            ${restart_step}. Restarts recorded so far: ${restarts}.
            """,
            annotations=JOB_CONTEXT,
        ),
    ),
)
