"""Is trainguard itself watching? TrainguardCollectorFailing, TrainguardExporterDown (critical
when the vanished exporter was watching active runs: a dead host cannot report their death)."""

from __future__ import annotations

from alerts.rules.common import Alert, Group, query_value

SNIPPETS = {
    "active": query_value(
        "last_over_time(instance:trainguard_run_active_ranks:sum{job=%q,instance=%q}"
        "[${exporter_down_active_lookback}])",
        "$labels.job $labels.instance",
    ),
}

GROUP = Group(
    "trainguard-exporter",
    snippets=SNIPPETS,
    rules=(
        Alert(
            "TrainguardCollectorFailing",
            "warning",
            expr="trainguard_collector_success == 0",
            for_="${collector_failing_for}",
            summary="""
            trainguard collector {{ $labels.collector }} on {{ $labels.instance }} is failing.
            """,
            description="""
            The {{ $labels.collector }} collector of the trainguard exporter on
            {{ $labels.instance }} has failed every scrape for ${collector_failing_for}. The
            metrics it provides are missing, so the alerts built on them cannot fire. See the
            exporter's log.
            """,
        ),
        Alert(
            "TrainguardExporterDown",
            "critical",
            expr="""
            up{${job_selector}} == 0
            and on (job, instance)
            last_over_time(
              instance:trainguard_run_active_ranks:sum[${exporter_down_active_lookback}]
            ) > 0
            """,
            for_="${exporter_down_for}",
            summary="""
            trainguard exporter {{ $labels.instance }} is down while training runs were
            active there.
            """,
            description="""
            Prometheus has failed to scrape the trainguard exporter {{ $labels.instance }}
            (job {{ $labels.job }}) for ${exporter_down_for}; when it was last seen it
            watched ${active} active training rank(s). The host may have rebooted or the VM been
            torn down, taking the runs with it; nothing can tell their death until it is back.
            """,
        ),
        Alert(
            "TrainguardExporterDown",
            "warning",
            expr="""
            up{${job_selector}} == 0
            unless on (job, instance)
            last_over_time(
              instance:trainguard_run_active_ranks:sum[${exporter_down_active_lookback}]
            ) > 0
            """,
            for_="${exporter_down_for}",
            summary="trainguard exporter {{ $labels.instance }} is down.",
            description="""
            Prometheus has failed to scrape the trainguard exporter {{ $labels.instance }}
            (job {{ $labels.job }}) for ${exporter_down_for}. No active training run was
            watched there when it was last seen, but none will be watched until it is back.
            """,
        ),
    ),
)
