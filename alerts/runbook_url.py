"""The ``runbook_url`` annotation: ``runbook_base`` with the exporter of a job's alert filled in.

The default ``runbook_base`` links to the runbook the alert's own exporter serves at /runbook
(``http://{{ or $labels.instance "localhost:9636" }}/runbook``). An alert about a job of many
nodes (TrainingJobRankDied, TrainingJobStalled, TrainingRankSlow...) aggregates across
exporters and has no ``instance`` label, so that link fell back to localhost:9636, which is no
exporter of the job from where on-call clicks it. In ``runbook_base``, ``$labels.instance``
therefore stands for the alert's exporter: its own ``instance``, else that of the lowest rank of
its job (``job_id``) or run, read when the annotation is rendered (one query, only for alerts
without an instance); ``localhost:9636`` stays for an alert about neither (the Watchdog). A
``runbook_base`` without ``$labels.instance`` (a wiki) is used as it is. "Lowest" is by the rank
label's text (templates sort no numbers): rank 0 whenever it reports, which it does in any job
whose ranks all report.
"""

from __future__ import annotations

from collections.abc import Mapping

from alerts.rules.common import Alert, fill

#: what runbook_base writes for the alert's exporter
INSTANCE = "$labels.instance"
#: the threshold an expression that judges a job across its nodes aggregates by
ACROSS = "target_labels_across"


def _lowest_rank(selector: str, args: str) -> str:
    """Set ``$instance`` to the ``instance`` of the lowest rank ``selector`` finds, if any."""
    return (
        "{{ with printf `" + selector + "` " + args + ' | query | sortByLabel "rank" }}'
        "{{ $instance = (first .).Labels.instance }}{{ end }}"
    )


#: defines ``$instance``: the alert's own, else the exporter of its job's or run's lowest rank
PRELUDE = (
    "{{ $instance := $labels.instance }}{{ if not $instance }}{{ if $labels.job_id }}"
    + _lowest_rank(
        "trainguard_run_job_info{${target_labels_across_sel},run=%q,job_id=%q}",
        "${target_labels_across_args} $labels.run $labels.job_id",
    )
    + "{{ else if $labels.run }}"
    + _lowest_rank(
        "trainguard_run_info{${target_labels_across_sel},run=%q}",
        "${target_labels_across_args} $labels.run",
    )
    + "{{ end }}{{ end }}"
)


def runbook_url(alert: Alert, table: Mapping[str, str], across: bool) -> str:
    """The ``runbook_url`` of ``alert``: ``runbook_base#<alert's name lowercased>``, as above.

    Only an alert whose expression judges across nodes (``across``: it uses
    ``${target_labels_across}``, itself or through a snippet) can lack an ``instance``: the
    others keep the plain link, short and free to render.
    """
    base = fill("${runbook_base}", table)
    anchor = "#" + alert.name.lower()
    if INSTANCE not in base or not across:
        return base + anchor
    return fill(PRELUDE, table) + base.replace(INSTANCE, "$instance") + anchor
