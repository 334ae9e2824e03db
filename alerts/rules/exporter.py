"""Is trainguard itself watching? The exporter's own alerts.

TrainguardCollectorFailing, TrainguardStateDirMissing (no run can be watched: a typo in
--state.dir), TrainguardHeartbeatFileInvalid (one file the exporter cannot use),
TrainguardExporterDown (critical
when the exporter, failing its scrapes or gone from service discovery, was watching active runs:
a dead host cannot report their death; not when those were only ranks of jobs that step again
on other nodes, whose ranks there are history), and Watchdog, which always fires so that a dead
man's switch notices when the whole alerting pipeline stops.
"""

from __future__ import annotations

from alerts.kinds import DURATION, Threshold
from alerts.rules.common import Alert, Group, query_value
from alerts.rules.jobs.deaths import JOB_STEPPING, LOST
from alerts.rules.recording import last_seen

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "collector_failing_for",
        "5m",
        DURATION,
        "TrainguardCollectorFailing: a collector failed every scrape for this long.",
    ),
    Threshold(
        "state_dir_missing_for",
        "10m",
        DURATION,
        "TrainguardStateDirMissing: the exporter's state directory was missing this long.",
    ),
    Threshold(
        "heartbeat_file_invalid_for",
        "10m",
        DURATION,
        "TrainguardHeartbeatFileInvalid: a heartbeat file could not be used for this long.",
    ),
    Threshold(
        "exporter_down_for",
        "5m",
        DURATION,
        "TrainguardExporterDown: Prometheus failed to scrape the exporter for this long.",
    ),
    Threshold(
        "exporter_down_active_lookback",
        "1d",
        DURATION,
        "TrainguardExporterDown is critical when the target was watching an active run at the "
        "last evaluation before it vanished, looking back at most this far; a target that left "
        "service discovery is remembered (and alerted on) this long.",
    ),
)

SNIPPETS = {
    # PromQL: a target's last up and active ranks while it has been down (recording.last_seen)
    "any_target_last_seen": last_seen("up{${job_selector}}"),
    "active_last_seen": last_seen("instance:trainguard_run_active_ranks:sum"),
    # PromQL, one series per target: it watched active ranks when last seen, and not only ranks
    # that are history now (ranks of jobs whose runs step again on other nodes: a spot node
    # deleted after its job was requeued elsewhere, an elastic job that went on without it)
    "watched_live": (
        "(${active_last_seen} > 0 unless on (${target_labels}) ("
        "count by (${target_labels}) (" + LOST + " == 1"
        " and on (${target_labels_across}, run) " + JOB_STEPPING + ")"
        " >= on (${target_labels}) ${active_last_seen}))"
    ),
    # How Prometheus lost the exporter: its scrapes fail (up == 0), or it is no target at all.
    "down_how": (
        "{{ with printf `up{${target_labels_sel}}` ${target_labels_args} | query }}"
        "has failed to scrape the trainguard exporter {{ $labels.instance }} (job"
        " {{ $labels.job }}) for ${exporter_down_for}{{ else }}no longer has the trainguard"
        " exporter {{ $labels.instance }} (job {{ $labels.job }}) among its targets, nor has it"
        " scraped it for ${exporter_down_for}: it left service discovery (its DaemonSet pod"
        " deleted or evicted, its host removed from file_sd or static_configs){{ end }}"
    ),
    "active": query_value(
        "last_over_time(instance:trainguard_run_active_ranks:sum{${target_labels_sel}}"
        "[${exporter_down_active_lookback}])",
        "${target_labels_args}",
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
        # The shipped deployments create the state directory (tmpfiles, hostPath): missing, it is
        # not the one the exporter was told (a typo), or it was removed. Nothing else would say so:
        # 0 heartbeats look like an idle host.
        Alert(
            "TrainguardStateDirMissing",
            "warning",
            expr="trainguard_state_dir_present == 0",
            for_="${state_dir_missing_for}",
            summary="""
            trainguard exporter {{ $labels.instance }} has no state directory: no training
            run there can be watched.
            """,
            description="""
            The state directory {{ $labels.path }} of the trainguard exporter on
            {{ $labels.instance }} has not existed (or could not be listed) for
            ${state_dir_missing_for}. Training processes write their heartbeats there; without
            it no death, stall or NaN on this host can page. Is --state.dir the directory the
            jobs write to ($TRAINGUARD_STATE_DIR on their side)?
            """,
        ),
        # One file the exporter cannot use costs that file only: every other run is published,
        # and the run the file held is kept from its last valid reading (if the exporter had one).
        Alert(
            "TrainguardHeartbeatFileInvalid",
            "warning",
            expr="max by (${target_labels}, file) (trainguard_heartbeat_file_invalid == 1)",
            for_="${heartbeat_file_invalid_for}",
            summary="""
            A heartbeat file on {{ $labels.instance }} cannot be read: {{ $labels.file }}.
            """,
            description="""
            The trainguard exporter on {{ $labels.instance }} could not use the heartbeat file
            {{ $labels.file }} for ${heartbeat_file_invalid_for} (its log says why). Every other
            run is watched; the run this file held is judged from its last valid reading if the
            exporter read one since it started, and is not watched at all otherwise.
            """,
        ),
        Alert(
            "TrainguardExporterDown",
            "critical",
            expr="""
            (
              max by (${target_labels}) (up{${job_selector}} == 0)
              or
              (
                max by (${target_labels}) (
                  ${any_target_last_seen}
                )
                unless on (${target_labels}) up{${job_selector}}
              )
            )
            and on (${target_labels}) ${watched_live}
            """,
            for_="${exporter_down_for}",
            summary="""
            trainguard exporter {{ $labels.instance }} is down while training runs were
            active there.
            """,
            description="""
            Prometheus ${down_how}; when it was last seen it watched ${active} active training
            rank(s). The host may have rebooted or the VM been torn down, taking the runs with
            it; nothing can tell their death until it is back.
            """,
        ),
        Alert(
            "TrainguardExporterDown",
            "warning",
            expr="""
            max by (${target_labels}) (up{${job_selector}} == 0)
            unless on (${target_labels}) ${watched_live}
            """,
            for_="${exporter_down_for}",
            summary="trainguard exporter {{ $labels.instance }} is down.",
            description="""
            Prometheus has failed to scrape the trainguard exporter {{ $labels.instance }}
            (job {{ $labels.job }}) for ${exporter_down_for}. No active training run was
            watched there when it was last seen (or only ranks of jobs that step again on other
            nodes now), but none will be watched until it is back.
            """,
        ),
        Alert(
            "Watchdog",
            "none",
            expr="vector(1)",
            summary="The trainguard alerting pipeline is alive (this alert always fires).",
            description="""
            Always firing, on purpose: Prometheus evaluates the trainguard rules and reaches
            Alertmanager. Route it to a dead man's switch that raises the alarm when it stops
            arriving (see deploy/alertmanager.yml): then Prometheus is down, stuck or cut off
            from Alertmanager, and no other trainguard alert can arrive either. Never silence it.
            """,
        ),
    ),
)
