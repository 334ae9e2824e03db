"""The runs dashboard's exporter row: is every exporter scraped, and are its collectors well.

A failing or slow collector explains a gap in the panels above it.
"""

from __future__ import annotations

from grafana.panels import Panel, state_timeline, table_panel, ts, value_mappings
from grafana.promql import I, Promql


def panels(q: Promql) -> list[Panel]:
    """The exporters themselves: collectors failing or slow, versions, scrapeable or not."""
    build_info = f"last_over_time(trainguard_exporter_build_info{{{I}}}[1d])"
    return [
        state_timeline(
            "Collector success",
            "Whether each collector of each exporter succeeded at its last scrape. One failing "
            "collector does not hide the others (TrainguardCollectorFailing).",
            (
                q.by("instance, collector", "trainguard_collector_success", "min", I),
                "{{instance}} {{collector}}",
            ),
            value_mappings(("failing", "red"), ("ok", "green")),
            w=12,
        ),
        ts(
            "Collector duration",
            "Time each collector took at scrape time. A slow NFS stat shows up here first.",
            "s",
            [
                (
                    q.by("instance, collector", "trainguard_collector_duration_seconds", "max", I),
                    "{{instance}} {{collector}}",
                )
            ],
            minimum=0,
        ),
        table_panel(
            "Exporters",
            "Exporters seen in the time range, their version and whether Prometheus can scrape "
            "them now (up).",
            [
                f"max {q.group_by('instance, version')} ({build_info})",
                f"max {q.group_by('instance')} "
                f"(up{{{I}}} and {q.join_on('instance, job')} {build_info})",
            ],
            columns={
                "instance": ("Exporter", ""),
                "version": ("Version", ""),
                "Value #B": ("Up", "none"),
            },
            hide=("Value #A",),
            thresholds=((None, "red"), (1, "green")),
            h=6,
        ),
        ts(
            "State directory and heartbeat files",
            "Per exporter: whether its state directory exists (0: nothing it watches can page: "
            "TrainguardStateDirMissing) and the heartbeat files it could not use, one series "
            "per file (TrainguardHeartbeatFileInvalid): each costs only that file, the other "
            "runs are still published.",
            "none",
            [
                (
                    q.by("instance", "trainguard_state_dir_present", "min", I),
                    "{{instance}} state dir present",
                ),
                (
                    f"count {q.group_by('instance')} (trainguard_heartbeat_file_invalid{{{I}}})"
                    f" or {q.by('instance', 'trainguard_state_dir_present', 'min', I)} * 0",
                    "{{instance}} invalid heartbeat files",
                ),
            ],
            minimum=0,
        ),
    ]
