"""Where a stalled job is stuck: the rank(s) whose location differs from the rest.

TrainingRankStuck, and the ``stuck`` annotation of TrainingStalled and TrainingNoFirstStep.

When one rank of a job hangs, the others soon wait for it inside a collective, and every rank
stops stepping. Each rank's reporter then samples where its main thread is
(``trainguard_run_stuck_info{where, collective}``, per run and rank). The rank that holds the
job up is the one NOT inside the collective the others wait in; when no rank is inside a
collective Python can see (DDP's all-reduce runs from C++ during ``backward()``), the ranks at a
location fewer ranks share than the job's most common one. A job spans nodes (one exporter,
one ``instance``, each): these rules compare its ranks across instances, by the target labels
without ``instance`` (``${target_labels_across}``) plus ``run`` and ``job_id``: the ranks of one
job, never two jobs that share a run name (a framework's default run name), whose ranks wait
for nothing of each other. Ranks of no known job are compared by run, as one job.

A rank saving a checkpoint (``saving="true"``: its sampled stack is inside a save) is not apart
while its step is within its stall threshold: rank 0 writing a 12-minute checkpoint while the
others wait for it in a barrier is a routine pause, which that threshold (the run's own longest
recent interval between steps, times ``stall_factor``) has learned; a save that outlasts it
(a hung file system) is apart like any other location.
"""

from __future__ import annotations

from alerts.kinds import DURATION, Threshold
from alerts.rules.common import Alert, Group, Record

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "stuck_for",
        "10m",
        DURATION,
        "TrainingRankStuck: how long rank(s) of a job must be stuck apart from the rest (outside "
        "the collective the others wait in) before it fires. Each rank reports where it is "
        "once its step is overdue by its own pace (3x its median interval between steps, at "
        "least 30 s).",
    ),
)

#: each stuck rank's trainguard_run_stuck_info with its job's ``job_id`` (none for a rank of
#: no known job), less the ranks saving a checkpoint within their stall threshold
STUCK = "run_rank:trainguard_run_stuck:info"
#: the rank(s) stuck apart from the rest of their job (labels instance, rank, where, collective)
APART = "run_rank:trainguard_run_stuck_apart:info"
JOB = "${target_labels_across}, run, job_id"
JOB_SEL = "${target_labels_across_sel},run=%q,job_id=%q"
JOB_ARGS = "${target_labels_across_args} $labels.run $labels.job_id"

#: "rank 17 on node-3 (node-3:9636) in `load_batch <- train.py:88`, rank 20 on ..." (also
#: in the job stall alerts' summaries, jobs/stall.py)
APART_RANKS = (
    "{{ range $i, $s := printf `" + APART + "{" + JOB_SEL + "} * on (${target_labels}, run, "
    "rank) group_left (host) max by (${target_labels}, run, rank, host) (trainguard_run_info)` "
    + JOB_ARGS
    + ' | query | sortByLabel "rank" }}{{ if $i }}, {{ end }}rank {{ $s.Labels.rank }} on '
    "{{ $s.Labels.host }} ({{ $s.Labels.instance }}) in `{{ $s.Labels.where }}`{{ end }}"
)
# " [127 rank(s) in all_reduce] [2 rank(s) in `Tensor.backward <- train.py:50 step`]": the rest
_THE_REST = (
    "{{ range printf `count by ("
    + JOB
    + ", collective) ("
    + STUCK
    + "{"
    + JOB_SEL
    + ',collective!=""} unless on (${target_labels}, run, rank) '
    + APART
    + ")` "
    + JOB_ARGS
    + ' | query | sortByLabel "collective" }} [{{ . | value | printf "%.0f" }} rank(s) in '
    "{{ .Labels.collective }}]{{ end }}"
    "{{ range printf `count by ("
    + JOB
    + ", where) ("
    + STUCK
    + "{"
    + JOB_SEL
    + ',collective=""} unless on (${target_labels}, run, rank) '
    + APART
    + ")` "
    + JOB_ARGS
    + ' | query | sortByLabel "where" }} [{{ . | value | printf "%.0f" }} rank(s) in '
    "`{{ .Labels.where }}`]{{ end }}"
)

#: the ``stuck`` annotation of the stall alerts: where the job's ranks are, across its nodes
STUCK_ANNOTATION = (
    "{{ with printf `" + STUCK + "{" + JOB_SEL + "}` " + JOB_ARGS + " | query }}"
    "{{ with printf `" + APART + "{" + JOB_SEL + "}` " + JOB_ARGS + " | query }}"
    "Stuck apart from the rest: " + APART_RANKS + ". Where the others are:"
    "{{ else }}Where the ranks are:{{ end }}" + _THE_REST + ".{{ else }}No rank reported where it "
    "is stuck.{{ end }}"
)

GROUP = Group(
    "trainguard-stuck",
    snippets={"apart_ranks": APART_RANKS, "the_rest": _THE_REST, "stuck": STUCK, "job": JOB},
    rules=(
        Record(
            STUCK,
            """
            (
              trainguard_run_stuck_info
              * on (${target_labels}, run, rank) group_left (job_id) trainguard_run_job_info
              or
              trainguard_run_stuck_info
              unless on (${target_labels}, run, rank) trainguard_run_job_info
            )
            # saving a checkpoint, a pause the rank's stall threshold has learned
            unless on (${target_labels}, run, rank) (
              run_rank:trainguard_run_step_age_seconds:running
              <= run_rank:trainguard_run_stall_threshold_seconds:clamp
              and on (${target_labels}, run, rank) trainguard_run_stuck_info{saving="true"}
            )
            """,
        ),
        Record(
            APART,
            # outside any collective while others of the job wait in one...
            """
            (
              ${stuck}{collective=""}
              and on (${job}) ${stuck}{collective!=""}
            )
            or
            # ...else, with no rank in a collective, at a location fewer ranks share than the
            # job's most common one
            (
              ${stuck}
              and on (${job}, where)
                (
                  count by (${job}, where) (${stuck})
                  < on (${job}) group_left ()
                  max by (${job}) (count by (${job}, where) (${stuck}))
                )
              unless on (${job}) ${stuck}{collective!=""}
            )
            """,
        ),
        Alert(
            "TrainingRankStuck",
            "warning",
            expr="count by (" + JOB + ") (" + APART + ")",
            for_="${stuck_for}",
            keep_firing_for="${keep_firing_for}",
            summary="""
            Training run {{ $labels.run }}{{ with $labels.job_id }} (job {{ . }}){{ end }} is
            held up by {{ $value }} rank(s) stuck apart from the rest.
            """,
            description="""
            Run {{ $labels.run }}{{ with $labels.job_id }} (job {{ . }}){{ end }} has stopped
            stepping, held up by ${apart_ranks}. The other ranks wait for it:${the_rest}. A
            collective cannot complete until every rank joins it: look at what the rank(s)
            named first wait for (py-spy dump --pid on that host, the runbook), then restart
            the job from its newest checkpoint.
            """,
        ),
    ),
)
