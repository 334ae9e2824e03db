"""Generate trainguard's Grafana dashboards from code.

Run ``python grafana/generate.py`` to (re)write ``grafana/dashboards/*.json``;
``python grafana/generate.py --check`` exits non-zero when the committed JSON is stale.
Import it and call :func:`build_dashboards` to get ``{filename: dashboard_dict}``.

The dashboards are built with grafana-foundation-sdk (Grafana 11.6 schema) and only use raw
``trainguard_*`` metrics (plus ``ALERTS``/``up``), so they work without the recording rules.
Every query is filtered on ``instance=~"$instance"`` and, where the metric has a ``run`` label,
on ``run=~"$run"``. Per-rank series are kept where a straggler matters (step, heartbeat,
allocator); summaries are aggregated by ``run`` so a run spread over several nodes (one
exporter each) reads as one line.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import (
    bargauge,
    prometheus,
    stat,
    statetimeline,
    table,
    timeseries,
)
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DashboardLinkType,
    DataSourceRef,
    DataTransformerConfig,
    DynamicConfigValue,
    FieldColorModeId,
    Threshold,
    ThresholdsMode,
    ValueMap,
    ValueMappingResult,
    VariableOption,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

DASHBOARD_DIR = Path(__file__).resolve().parent / "dashboards"

UID_RUNS = "trainguard-runs"
UID_GPU = "trainguard-gpu-memory"
UID_CHECKPOINTS = "trainguard-checkpoints"

DS = DataSourceRef(type_val="prometheus", uid="${datasource}")

# Label matchers used in every query.
I = 'instance=~"$instance"'  # noqa: E741 - short on purpose: it is in every expression
R = 'run=~"$run"'
IR = f"{I}, {R}"

# Alerts owned by trainguard (alerts/trainguard.rules.yml).
TRAINGUARD_ALERTS = (
    "Training.*|Checkpoint.*|GPU.*|Allocator.*|Trainguard.*|DuplicateHostProcess|StepsAtRisk"
    "|RepeatedDeathNearSameStep"
)

# Value mapping for the combined run state (see RUN_STATE_EXPR).
RUN_STATE_MAPPINGS = [
    ValueMap(
        options={
            "0": ValueMappingResult(text="dead", color="red", index=0),
            "1": ValueMappingResult(text="alive", color="green", index=1),
            "2": ValueMappingResult(text="finished", color="blue", index=2),
        }
    )
]

# 2 = exited cleanly, 1 = process alive (PID and create time match), 0 = gone without a clean exit.
RUN_STATE_EXPR = (
    "max by (run, rank) (\n"
    f"  2 * (trainguard_run_finished{{{IR}}} == 1)\n"
    "  or on (instance, run, rank)\n"
    f"  trainguard_run_process_up{{{IR}}}\n"
    ")"
)

# Steps per minute. deriv() rather than rate(): the step is a gauge that goes *down* when a run
# resumes from an older checkpoint, and rate() would read that as a counter reset and draw a
# spike of (new step / window). clamp_min hides the brief negative slope of a resume.
STEPS_PER_MIN_EXPR = (
    f"clamp_min(max by (run, rank) (deriv(trainguard_run_step{{{IR}}}[5m])), 0) * 60"
)


# --------------------------------------------------------------------------------------------
# Small helpers over the SDK builders
# --------------------------------------------------------------------------------------------


def _target(
    expr: str,
    legend: str = "__auto",
    ref: str = "A",
    *,
    instant: bool = False,
    table_format: bool = False,
) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DS)
    q = q.instant() if instant else q.range()
    if table_format:
        q = q.format(PromQueryFormat.TABLE)
    return q


def _thresholds(*steps: tuple[float | None, str]) -> db.ThresholdsConfig:
    return (
        db.ThresholdsConfig()
        .mode(ThresholdsMode.ABSOLUTE)
        .steps([Threshold(value=v, color=c) for v, c in steps])
    )


OK_THRESHOLDS = ((None, "green"),)
NONZERO_IS_BAD = ((None, "green"), (1, "red"))


def _legend(calcs: Sequence[str] = ("lastNotNull", "max")) -> common_builders.VizLegendOptions:
    return (
        common_builders.VizLegendOptions()
        .display_mode(common.LegendDisplayMode.TABLE)
        .placement(common.LegendPlacement.BOTTOM)
        .show_legend(True)
        .calcs(list(calcs))
    )


def _tooltip() -> common_builders.VizTooltipOptions:
    return (
        common_builders.VizTooltipOptions()
        .mode(common.TooltipDisplayMode.MULTI)
        .sort(common.SortOrder.DESCENDING)
    )


def ts(
    title: str,
    description: str,
    unit: str,
    targets: Sequence[prometheus.Dataquery],
    *,
    w: int = 12,
    h: int = 8,
    thresholds: Sequence[tuple[float | None, str]] = OK_THRESHOLDS,
    bars: bool = False,
    stacked: bool = False,
    minimum: float | None = None,
) -> timeseries.Panel:
    """A time series panel."""
    p = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .targets(list(targets))
        .span(w)
        .height(h)
        .legend(_legend())
        .tooltip(_tooltip())
        .thresholds(_thresholds(*thresholds))
        .color_scheme(db.FieldColor().mode(FieldColorModeId.PALETTE_CLASSIC))
        .fill_opacity(10)
        .line_width(1)
        .span_nulls(False)
    )
    if bars:
        p = p.draw_style(common.GraphDrawStyle.BARS).fill_opacity(60)
    if stacked:
        p = p.stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
    if minimum is not None:
        p = p.min(minimum)
    return p


def stat_panel(
    title: str,
    description: str,
    unit: str,
    targets: Sequence[prometheus.Dataquery],
    *,
    w: int = 6,
    h: int = 4,
    thresholds: Sequence[tuple[float | None, str]] = OK_THRESHOLDS,
    mappings: list[Any] | None = None,
) -> stat.Panel:
    """A single-value panel (last value)."""
    p = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .targets(list(targets))
        .span(w)
        .height(h)
        .thresholds(_thresholds(*thresholds))
        .color_mode(common.BigValueColorMode.BACKGROUND)
        .graph_mode(common.BigValueGraphMode.NONE)
        .text_mode(common.BigValueTextMode.VALUE_AND_NAME)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    if mappings:
        p = p.mappings(mappings)
    return p


def table_panel(
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    *,
    columns: dict[str, tuple[str, str]],
    hide: Sequence[str] = (),
    w: int = 24,
    h: int = 8,
    unit: str = "none",
    transform: str = "merge",
    thresholds: Sequence[tuple[float | None, str]] = OK_THRESHOLDS,
    extra: Mapping[str, Sequence[DynamicConfigValue]] | None = None,
) -> table.Panel:
    """A table of instant queries joined on their labels.

    ``columns`` maps a field name (``Value #B``, or a label) to ``(display name, unit)``;
    ``extra`` adds more field properties (mappings, cell colours) to some of them.
    """
    excluded = {"Time": True, "__name__": True, "job": True}
    excluded.update({name: True for name in hide})
    p = (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .targets(list(targets))
        .span(w)
        .height(h)
        .thresholds(_thresholds(*thresholds))
        .with_transformation(DataTransformerConfig(id_val=transform, options={}))
        .with_transformation(
            DataTransformerConfig(id_val="organize", options={"excludeByName": excluded})
        )
    )
    for field, (display, field_unit) in columns.items():
        props = [DynamicConfigValue(id_val="displayName", value=display)]
        if field_unit:
            props.append(DynamicConfigValue(id_val="unit", value=field_unit))
        props.extend((extra or {}).get(field, ()))
        p = p.override_by_name(field, props)
    return p


def state_timeline(
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    mappings: list[Any],
    *,
    w: int = 24,
    h: int = 8,
) -> statetimeline.Panel:
    return (
        statetimeline.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit("none")
        .targets(list(targets))
        .span(w)
        .height(h)
        .mappings(mappings)
        .thresholds(_thresholds((None, "text")))
        .color_scheme(db.FieldColor().mode(FieldColorModeId.THRESHOLDS))
        .show_value(common.VisibilityMode.AUTO)
        .merge_values(True)
        .row_height(0.8)
        .fill_opacity(80)
    )


def _dashed(p: timeseries.Panel, regexp: str) -> timeseries.Panel:
    """Draw the series matching ``regexp`` as a dashed line without fill (a limit, a forecast)."""
    return p.override_by_regexp(
        regexp,
        [
            DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}),
            DynamicConfigValue(id_val="custom.fillOpacity", value=0),
            DynamicConfigValue(id_val="custom.stacking", value={"mode": "none", "group": "A"}),
        ],
    )


def _color(p: Any, regexp: str, color: str) -> Any:
    return p.override_by_regexp(
        regexp,
        [DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": color})],
    )


def _variables() -> list[Any]:
    all_selected = VariableOption(selected=True, text=["All"], value=["$__all"])
    return [
        db.DatasourceVariable("datasource")
        .label("Data source")
        .description("Prometheus that scrapes the trainguard exporters.")
        .type("prometheus"),
        db.QueryVariable("instance")
        .label("Exporter")
        .description("trainguard exporter (one per GPU host).")
        .datasource(DS)
        .query("label_values(trainguard_exporter_build_info, instance)")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(all_selected),
        db.QueryVariable("run")
        .label("Run")
        .description("Training run (the `run` label), across the selected exporters.")
        .datasource(DS)
        .query(f"label_values(trainguard_run_info{{{I}}}, run)")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(all_selected),
    ]


def _dashboard(uid: str, title: str, description: str) -> db.Dashboard:
    d = (
        db.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["trainguard"])
        .editable()
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .link(
            db.DashboardLink("trainguard")
            .type(DashboardLinkType.DASHBOARDS)
            .tags(["trainguard"])
            .as_dropdown(True)
            .icon("external link")
            .include_vars(True)
            .keep_time(True)
        )
    )
    d = d.annotation(
        db.AnnotationQuery()
        .name("Annotations & Alerts")
        .datasource(DataSourceRef(type_val="grafana", uid="-- Grafana --"))
        .enable(True)
        .hide(True)
        .icon_color("rgba(0, 211, 255, 1)")
        .type("dashboard")
        .built_in(1)
    )
    for v in _variables():
        d = d.with_variable(v)
    return d


# --------------------------------------------------------------------------------------------
# Training runs
# --------------------------------------------------------------------------------------------


def runs_dashboard() -> db.Dashboard:
    d = _dashboard(
        UID_RUNS,
        "Training runs",
        "Is each training run alive, progressing, checkpointed? Deaths and firing alerts.",
    )

    d = d.with_row(db.Row("Status"))
    d = d.with_panel(
        table_panel(
            "Firing trainguard alerts",
            "Alerts from alerts/trainguard.rules.yml that are firing now (Prometheus' ALERTS "
            "series). Alerts that are not tied to one run or one exporter (no run / instance "
            "label) are always shown. Empty table = nothing firing.",
            [
                _target(
                    f'ALERTS{{alertstate="firing", alertname=~"{TRAINGUARD_ALERTS}", '
                    'instance=~"$instance|", run=~"$run|"}',
                    instant=True,
                    table_format=True,
                )
            ],
            columns={"alertname": ("Alert", ""), "severity": ("Severity", "")},
            hide=("Value", "alertstate"),
            transform="merge",
            h=6,
        )
    )
    d = d.with_panel(
        state_timeline(
            "Run state per rank",
            "alive = the rank's PID exists with the recorded create time; finished = the run "
            "wrote its clean-exit marker; dead = the process is gone without a clean exit "
            "(kill -9, OOM killer, reboot) or the PID was reused by another process.",
            [_target(RUN_STATE_EXPR, "{{run}} rank {{rank}}")],
            RUN_STATE_MAPPINGS,
            h=8,
        )
    )
    d = d.with_panel(
        stat_panel(
            "Ranks alive",
            "Ranks whose training process is alive (PID + create time match).",
            "none",
            [_target(f"count(trainguard_run_process_up{{{IR}}} == 1) or vector(0)", "alive")],
        )
    )
    d = d.with_panel(
        stat_panel(
            "Ranks dead",
            "Ranks whose process is gone without a clean exit. Anything above 0 is a death "
            "(TrainingProcessDied).",
            "none",
            [
                _target(
                    f"count(\n  trainguard_run_process_up{{{IR}}} == 0\n"
                    f"  unless on (instance, run, rank) trainguard_run_finished{{{IR}}} == 1\n"
                    ") or vector(0)",
                    "dead",
                )
            ],
            thresholds=NONZERO_IS_BAD,
        )
    )
    d = d.with_panel(
        stat_panel(
            "Ranks finished",
            "Ranks that exited cleanly (their absence is not a death).",
            "none",
            [_target(f"count(trainguard_run_finished{{{IR}}} == 1) or vector(0)", "finished")],
            thresholds=((None, "blue"),),
        )
    )
    d = d.with_panel(
        stat_panel(
            "Deaths (all time)",
            "Deaths recorded by the reporter when a run restarted under the same name, summed "
            "over the selected runs.",
            "none",
            [
                _target(
                    f"sum(max by (run) (trainguard_run_deaths_total{{{IR}}})) or vector(0)",
                    "deaths",
                )
            ],
            thresholds=NONZERO_IS_BAD,
        )
    )
    d = d.with_panel(
        table_panel(
            "Runs now",
            "One row per run and rank: where it runs, its state, step, throughput and how old "
            "its heartbeat is. State: 0 dead, 1 alive, 2 finished.",
            [
                _target(
                    f"max by (run, rank, host, pid) (trainguard_run_info{{{IR}}})",
                    ref="A",
                    instant=True,
                    table_format=True,
                ),
                _target(RUN_STATE_EXPR, ref="B", instant=True, table_format=True),
                _target(
                    f"max by (run, rank) (trainguard_run_step{{{IR}}})",
                    ref="C",
                    instant=True,
                    table_format=True,
                ),
                _target(STEPS_PER_MIN_EXPR, ref="D", instant=True, table_format=True),
                _target(
                    f"time() - max by (run, rank) "
                    f"(trainguard_run_heartbeat_timestamp_seconds{{{IR}}})",
                    ref="E",
                    instant=True,
                    table_format=True,
                ),
                _target(
                    f"max by (run, rank) (trainguard_run_heartbeat_timestamp_seconds{{{IR}}}) "
                    "* 1000",
                    ref="F",
                    instant=True,
                    table_format=True,
                ),
            ],
            columns={
                "run": ("Run", ""),
                "rank": ("Rank", ""),
                "host": ("Host", ""),
                "pid": ("PID", ""),
                "Value #B": ("State", "none"),
                "Value #C": ("Step", "none"),
                "Value #D": ("Steps/min", "none"),
                "Value #E": ("Heartbeat age", "s"),
                "Value #F": ("Last heartbeat", "dateTimeAsIso"),
            },
            hide=("Value #A",),
            extra={
                "Value #B": [
                    DynamicConfigValue(id_val="mappings", value=RUN_STATE_MAPPINGS),
                    DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-text"}),
                ]
            },
            h=8,
        )
    )

    d = d.with_row(db.Row("Progress"))
    d = d.with_panel(
        ts(
            "Step",
            "Current training step per rank, from the heartbeat. A flat line while the rank is "
            "alive is a stall (TrainingStalled).",
            "none",
            [_target(f"max by (run, rank) (trainguard_run_step{{{IR}}})", "{{run}} rank {{rank}}")],
        )
    )
    d = d.with_panel(
        ts(
            "Steps per minute",
            "Training throughput per rank: clamp_min(deriv(step[5m]), 0) * 60. deriv, not rate: "
            "the step is a gauge that drops when a run resumes from an older checkpoint. A rank "
            "below its peers is a straggler; 0 while alive is a stall.",
            "none",
            [_target(STEPS_PER_MIN_EXPR, "{{run}} rank {{rank}}")],
            minimum=0,
        )
    )
    d = d.with_panel(
        ts(
            "Heartbeat age",
            "Seconds since each rank last wrote its heartbeat (time() - "
            "trainguard_run_heartbeat_timestamp_seconds). Grows without bound when a rank hangs "
            "or dies.",
            "s",
            [
                _target(
                    f"time() - max by (run, rank) "
                    f"(trainguard_run_heartbeat_timestamp_seconds{{{IR}}})",
                    "{{run}} rank {{rank}}",
                )
            ],
            thresholds=((None, "green"), (300, "orange"), (900, "red")),
            minimum=0,
        )
    )
    d = d.with_panel(
        ts(
            "Log age",
            "Seconds since the run's configured log file was last modified (runs with a "
            "log_file only). The watchdog that used to fire 20 minutes late (TrainingLogStale).",
            "s",
            [
                _target(
                    f"time() - max by (run) "
                    f"(trainguard_run_log_modified_timestamp_seconds{{{IR}}})",
                    "{{run}}",
                )
            ],
            thresholds=((None, "green"), (600, "orange"), (1200, "red")),
            minimum=0,
        )
    )

    d = d.with_row(db.Row("Checkpoints"))
    d = d.with_panel(
        ts(
            "Last checkpoint age per location",
            "Seconds since the newest COMPLETE checkpoint of each run at each location (primary "
            "or a mirror). Max over exporters that see the same (shared) directory.",
            "s",
            [
                _target(
                    f"time() - max by (run, location) "
                    f"(trainguard_checkpoint_last_timestamp_seconds{{{IR}}})",
                    "{{run}} {{location}}",
                )
            ],
            minimum=0,
        )
    )
    d = d.with_panel(
        ts(
            "Steps since last complete checkpoint",
            "Training steps that would be lost if the run died now: the run's current step minus "
            "the newest complete checkpoint's step, per location (StepsAtRisk).",
            "none",
            [
                _target(
                    f"max by (run) (trainguard_run_step{{{IR}}})\n"
                    "- on (run) group_right\n"
                    f"max by (run, location) (trainguard_checkpoint_last_step{{{IR}}})",
                    "{{run}} {{location}}",
                )
            ],
            minimum=0,
        )
    )

    d = d.with_row(db.Row("Deaths"))
    d = d.with_panel(
        table_panel(
            "Deaths per run",
            "Death history recorded by the reporter when a run restarts under the same name: "
            "how many times it died, at which step, when, and the inferred cause (reboot, "
            "oom_killer, unknown). The same step twice is RepeatedDeathNearSameStep.",
            [
                _target(
                    f"max by (run) (trainguard_run_deaths_total{{{IR}}})",
                    ref="A",
                    instant=True,
                    table_format=True,
                ),
                _target(
                    f"max by (run) (trainguard_run_last_death_step{{{IR}}})",
                    ref="B",
                    instant=True,
                    table_format=True,
                ),
                _target(
                    f"max by (run) (trainguard_run_last_death_timestamp_seconds{{{IR}}}) * 1000",
                    ref="C",
                    instant=True,
                    table_format=True,
                ),
                _target(
                    f"max by (run, cause) (trainguard_run_last_death_info{{{IR}}})",
                    ref="D",
                    instant=True,
                    table_format=True,
                ),
            ],
            columns={
                "run": ("Run", ""),
                "cause": ("Last cause", ""),
                "Value #A": ("Deaths", "none"),
                "Value #B": ("Last death step", "none"),
                "Value #C": ("Last death", "dateTimeAsIso"),
            },
            hide=("Value #D",),
            w=12,
        )
    )
    d = d.with_panel(
        ts(
            "Deaths in window",
            "Deaths recorded per run within each interval (increase of "
            "trainguard_run_deaths_total).",
            "none",
            [
                _target(
                    f"max by (run) (increase(trainguard_run_deaths_total{{{IR}}}"
                    "[$__rate_interval]))",
                    "{{run}}",
                )
            ],
            bars=True,
            minimum=0,
        )
    )

    d = d.with_row(db.Row("Exporter"))
    d = d.with_panel(
        state_timeline(
            "Collector success",
            "Whether each collector of each exporter succeeded at its last scrape. One failing "
            "collector does not hide the others (TrainguardCollectorFailing).",
            [
                _target(
                    f"min by (instance, collector) (trainguard_collector_success{{{I}}})",
                    "{{instance}} {{collector}}",
                )
            ],
            [
                ValueMap(
                    options={
                        "0": ValueMappingResult(text="failing", color="red", index=0),
                        "1": ValueMappingResult(text="ok", color="green", index=1),
                    }
                )
            ],
            w=12,
        )
    )
    d = d.with_panel(
        ts(
            "Collector duration",
            "Time each collector took at scrape time. A slow NFS stat shows up here first.",
            "s",
            [
                _target(
                    f"max by (instance, collector) (trainguard_collector_duration_seconds{{{I}}})",
                    "{{instance}} {{collector}}",
                )
            ],
            minimum=0,
        )
    )
    d = d.with_panel(
        table_panel(
            "Exporters",
            "Exporters seen in the time range, their version and whether Prometheus can scrape "
            "them now (up).",
            [
                _target(
                    f"max by (instance, version) "
                    f"(last_over_time(trainguard_exporter_build_info{{{I}}}[1d]))",
                    ref="A",
                    instant=True,
                    table_format=True,
                ),
                _target(
                    f"max by (instance) (up{{{I}}} and on (instance, job) "
                    f"last_over_time(trainguard_exporter_build_info{{{I}}}[1d]))",
                    ref="B",
                    instant=True,
                    table_format=True,
                ),
            ],
            columns={
                "instance": ("Exporter", ""),
                "version": ("Version", ""),
                "Value #B": ("Up", "none"),
            },
            hide=("Value #A",),
            thresholds=((None, "red"), (1, "green")),
            h=6,
        )
    )
    return d


# --------------------------------------------------------------------------------------------
# GPU memory
# --------------------------------------------------------------------------------------------


def gpu_memory_dashboard() -> db.Dashboard:
    d = _dashboard(
        UID_GPU,
        "GPU memory",
        "Driver view (NVML) vs the allocator's view (torch) of GPU memory: ghost memory, "
        "unattributed memory, fragmentation, retries and OOMs.",
    )

    d = d.with_row(db.Row("Devices"))
    d = d.with_panel(
        _dashed(
            ts(
                "Device memory used vs total",
                "Memory in use on each GPU as the driver (NVML) reports it, against the device "
                "total (dashed).",
                "bytes",
                [
                    _target(
                        f"trainguard_gpu_memory_used_bytes{{{I}}}",
                        "{{instance}} GPU {{gpu}} used",
                        "A",
                    ),
                    _target(
                        f"trainguard_gpu_memory_total_bytes{{{I}}}",
                        "{{instance}} GPU {{gpu}} total",
                        "B",
                    ),
                ],
                minimum=0,
            ),
            "/ total$/",
        )
    )
    d = d.with_panel(
        bargauge.Panel()
        .title("Device memory used (fraction)")
        .description("Used / total per GPU, now (driver view).")
        .datasource(DS)
        .unit("percentunit")
        .min(0)
        .max(1)
        .targets(
            [
                _target(
                    f"trainguard_gpu_memory_used_bytes{{{I}}}\n"
                    f"/ trainguard_gpu_memory_total_bytes{{{I}}}",
                    "{{instance}} GPU {{gpu}}",
                    instant=True,
                )
            ]
        )
        .thresholds(_thresholds((None, "green"), (0.85, "orange"), (0.95, "red")))
        .span(6)
        .height(8)
        .orientation(common.VizOrientation.HORIZONTAL)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    d = d.with_panel(
        table_panel(
            "GPUs",
            "The GPUs each exporter sees: index, model, UUID and driver version.",
            [
                _target(
                    f"max by (instance, gpu, name, uuid, driver_version) "
                    f"(trainguard_gpu_info{{{I}}})",
                    instant=True,
                    table_format=True,
                )
            ],
            columns={
                "instance": ("Exporter", ""),
                "gpu": ("GPU", ""),
                "name": ("Model", ""),
                "uuid": ("UUID", ""),
                "driver_version": ("Driver", ""),
            },
            hide=("Value",),
            w=6,
        )
    )
    d = d.with_panel(
        ts(
            "Unattributed device memory",
            "Device memory in use that no live process accounts for (device used minus the sum "
            "of live processes' memory). A few hundred MiB per GPU is driver overhead; more, "
            "sustained, is memory held after a crash (GPUUnattributedMemory). No value while "
            "a process's memory is unknown.",
            "bytes",
            [
                _target(
                    f"trainguard_gpu_memory_unattributed_bytes{{{I}}}",
                    "{{instance}} GPU {{gpu}}",
                )
            ],
            thresholds=((None, "green"), (1024**3, "red")),
            minimum=0,
        )
    )
    d = d.with_panel(
        ts(
            "Processes with unknown memory",
            "GPU processes whose memory NVML cannot report (WDDM / WSL). They are counted here "
            "instead of being published as 0 bytes; while this is non-zero the GPU's "
            "unattributed memory is unknown and left out.",
            "none",
            [
                _target(
                    f"trainguard_gpu_processes_memory_unknown{{{I}}}",
                    "{{instance}} GPU {{gpu}}",
                )
            ],
            thresholds=((None, "green"), (1, "orange")),
            minimum=0,
        )
    )

    d = d.with_row(db.Row("Processes (driver view)"))
    d = d.with_panel(
        ts(
            "Driver memory per process",
            "GPU memory per process as the driver reports it, stacked per exporter. run is "
            "empty for processes that are not a known training run.",
            "bytes",
            [
                _target(
                    f"trainguard_gpu_process_memory_used_bytes{{{IR}}}",
                    "{{instance}} GPU {{gpu}} pid {{pid}} {{run}}",
                )
            ],
            stacked=True,
            minimum=0,
        )
    )
    d = d.with_panel(
        table_panel(
            "GPU processes now",
            "Processes holding GPU memory now, per GPU, largest first.",
            [
                _target(
                    f"max by (instance, gpu, pid, run) "
                    f"(trainguard_gpu_process_memory_used_bytes{{{IR}}})",
                    instant=True,
                    table_format=True,
                )
            ],
            columns={
                "instance": ("Exporter", ""),
                "gpu": ("GPU", ""),
                "pid": ("PID", ""),
                "run": ("Run", ""),
                "Value": ("Driver memory", "bytes"),
            },
            w=12,
        )
    )

    d = d.with_row(db.Row("Runs: driver vs allocator"))
    d = d.with_panel(
        _color(
            _dashed(
                ts(
                    "Driver vs allocator memory per rank",
                    "Per rank: driver view (NVML, summed over the rank's PIDs and GPUs), the "
                    "allocator's reserved and allocated bytes (torch.cuda.memory_stats), and "
                    "the gap driver - reserved drawn as its own series. The gap is normally the "
                    "CUDA context (a few hundred MiB); a gap that grows or stays large is ghost "
                    "memory (GPUGhostMemory).",
                    "bytes",
                    [
                        _target(
                            f"sum by (run, rank) (trainguard_run_gpu_memory_used_bytes{{{IR}}})",
                            "{{run}} rank {{rank}} driver",
                            "A",
                        ),
                        _target(
                            f"sum by (run, rank) (trainguard_run_allocator_reserved_bytes{{{IR}}})",
                            "{{run}} rank {{rank}} reserved",
                            "B",
                        ),
                        _target(
                            f"sum by (run, rank) "
                            f"(trainguard_run_allocator_allocated_bytes{{{IR}}})",
                            "{{run}} rank {{rank}} allocated",
                            "C",
                        ),
                        _target(
                            f"sum by (run, rank) (trainguard_run_gpu_memory_used_bytes{{{IR}}})\n"
                            "-\n"
                            f"sum by (run, rank) "
                            f"(trainguard_run_allocator_reserved_bytes{{{IR}}})",
                            "{{run}} rank {{rank}} driver - reserved (ghost gap)",
                            "D",
                        ),
                    ],
                    w=16,
                    h=9,
                ),
                "/ghost gap/",
            ),
            "/ghost gap/",
            "red",
        )
    )
    d = d.with_panel(
        stat_panel(
            "Ghost-memory gap per run",
            "Driver view minus allocator reserved, summed over the run's ranks, now. Expect "
            "about one CUDA context per rank; far more is memory the allocator does not know "
            "about.",
            "bytes",
            [
                _target(
                    f"sum by (run) (trainguard_run_gpu_memory_used_bytes{{{IR}}})\n"
                    f"- sum by (run) (trainguard_run_allocator_reserved_bytes{{{IR}}})",
                    "{{run}}",
                )
            ],
            thresholds=((None, "green"), (2 * 1024**3, "orange"), (4 * 1024**3, "red")),
            w=8,
            h=9,
        )
    )
    d = d.with_panel(
        ts(
            "Allocator fragmentation",
            "reserved - allocated: memory the caching allocator holds but no tensor uses; "
            "inactive split: the part of it in split blocks that cannot serve a large request. "
            "High values before an OOM with 'free' VRAM point at fragmentation.",
            "bytes",
            [
                _target(
                    f"sum by (run, rank) (trainguard_run_allocator_reserved_bytes{{{IR}}})\n"
                    f"- sum by (run, rank) (trainguard_run_allocator_allocated_bytes{{{IR}}})",
                    "{{run}} rank {{rank}} reserved - allocated",
                    "A",
                ),
                _target(
                    f"sum by (run, rank) (trainguard_run_allocator_inactive_split_bytes{{{IR}}})",
                    "{{run}} rank {{rank}} inactive split",
                    "B",
                ),
            ],
            minimum=0,
        )
    )
    d = d.with_panel(
        ts(
            "Allocated and peak allocated",
            "Bytes held by live tensors and the peak since the process started (or since the "
            "training script last reset the peak).",
            "bytes",
            [
                _target(
                    f"sum by (run, rank) (trainguard_run_allocator_allocated_bytes{{{IR}}})",
                    "{{run}} rank {{rank}} allocated",
                    "A",
                ),
                _target(
                    f"sum by (run, rank) (trainguard_run_allocator_max_allocated_bytes{{{IR}}})",
                    "{{run}} rank {{rank}} peak",
                    "B",
                ),
            ],
            minimum=0,
        )
    )
    d = d.with_panel(
        ts(
            "Allocator retries, OOMs and snapshots",
            "Per interval: cudaMalloc retries (the allocator freed its cache to satisfy a "
            "request: AllocatorRetrying), out-of-memory errors (AllocatorOOM) and memory "
            "snapshots dumped at an OOM.",
            "none",
            [
                _target(
                    f"sum by (run, rank) (increase("
                    f"trainguard_run_allocator_alloc_retries_total{{{IR}}}[$__rate_interval]))",
                    "{{run}} rank {{rank}} retries",
                    "A",
                ),
                _target(
                    f"sum by (run, rank) (increase("
                    f"trainguard_run_allocator_ooms_total{{{IR}}}[$__rate_interval]))",
                    "{{run}} rank {{rank}} OOMs",
                    "B",
                ),
                _target(
                    f"sum by (run, rank) (increase("
                    f"trainguard_run_memory_snapshots_total{{{IR}}}[$__rate_interval]))",
                    "{{run}} rank {{rank}} snapshots",
                    "C",
                ),
            ],
            bars=True,
            minimum=0,
        )
    )
    d = d.with_panel(
        stat_panel(
            "OOMs in time range",
            "Out-of-memory errors per run over the dashboard's time range.",
            "none",
            [
                _target(
                    f"sum by (run) (increase("
                    f"trainguard_run_allocator_ooms_total{{{IR}}}[$__range]))",
                    "{{run}}",
                )
            ],
            thresholds=NONZERO_IS_BAD,
            w=6,
            h=8,
        )
    )
    d = d.with_panel(
        stat_panel(
            "Alloc retries in time range",
            "cudaMalloc retries per run over the dashboard's time range.",
            "none",
            [
                _target(
                    f"sum by (run) (increase("
                    f"trainguard_run_allocator_alloc_retries_total{{{IR}}}[$__range]))",
                    "{{run}}",
                )
            ],
            thresholds=((None, "green"), (1, "orange")),
            w=6,
            h=8,
        )
    )

    d = d.with_row(db.Row("Host processes"))
    d = d.with_panel(
        ts(
            "Host process counts",
            "Number of processes matching each configured name pattern (process_counts in the "
            "config file), e.g. the WSL VM host process. Two where there should be one is the "
            "DuplicateHostProcess alert.",
            "none",
            [_target(f"trainguard_process_count{{{I}}}", "{{instance}} {{name}}")],
            w=24,
            minimum=0,
        )
    )
    return d


# --------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------


def checkpoints_dashboard() -> db.Dashboard:
    d = _dashboard(
        UID_CHECKPOINTS,
        "Checkpoints",
        "Newest complete checkpoint per run and location, sizes vs the sizes recorded at write "
        "time, truncated / mismatched / partial files and free space.",
    )

    def by_loc(metric: str) -> str:
        # Several exporters may see the same shared directory: one value per run and location.
        return f"max by (run, location) ({metric}{{{IR}}})"

    d = d.with_row(db.Row("Overview"))
    d = d.with_panel(
        table_panel(
            "Checkpoint locations",
            "One row per run and location (primary or a mirror): newest complete step, when "
            "it was written, files and bytes, problem files and free space.",
            [
                _target(
                    by_loc("trainguard_checkpoint_last_step"),
                    ref="A",
                    instant=True,
                    table_format=True,
                ),
                _target(
                    by_loc("trainguard_checkpoint_last_timestamp_seconds") + " * 1000",
                    ref="B",
                    instant=True,
                    table_format=True,
                ),
                _target(
                    "time() - " + by_loc("trainguard_checkpoint_last_timestamp_seconds"),
                    ref="C",
                    instant=True,
                    table_format=True,
                ),
                _target(
                    by_loc("trainguard_checkpoint_files"), ref="D", instant=True, table_format=True
                ),
                _target(
                    by_loc("trainguard_checkpoint_bytes"), ref="E", instant=True, table_format=True
                ),
                _target(
                    by_loc("trainguard_checkpoint_truncated_files"),
                    ref="F",
                    instant=True,
                    table_format=True,
                ),
                _target(
                    by_loc("trainguard_checkpoint_hash_mismatch_files"),
                    ref="G",
                    instant=True,
                    table_format=True,
                ),
                _target(
                    by_loc("trainguard_checkpoint_partial_files"),
                    ref="H",
                    instant=True,
                    table_format=True,
                ),
                _target(
                    f"min by (run, location) "
                    f"(trainguard_checkpoint_filesystem_avail_bytes{{{IR}}})",
                    ref="I",
                    instant=True,
                    table_format=True,
                ),
            ],
            columns={
                "run": ("Run", ""),
                "location": ("Location", ""),
                "Value #A": ("Last step", "none"),
                "Value #B": ("Written", "dateTimeAsIso"),
                "Value #C": ("Age", "s"),
                "Value #D": ("Files", "none"),
                "Value #E": ("Bytes", "bytes"),
                "Value #F": ("Truncated", "none"),
                "Value #G": ("Hash mismatch", "none"),
                "Value #H": ("Partial", "none"),
                "Value #I": ("Free space", "bytes"),
            },
            h=8,
        )
    )
    for title, metric, desc, thr in (
        (
            "Truncated files",
            "trainguard_checkpoint_truncated_files",
            "Checkpoint files smaller than the size recorded when they were written, over the "
            "selected runs and locations (CheckpointTruncated). Files still being written are "
            "never counted.",
            NONZERO_IS_BAD,
        ),
        (
            "Hash-mismatch files",
            "trainguard_checkpoint_hash_mismatch_files",
            "Checkpoint files whose sha256 differs from the one recorded at write time "
            "(CheckpointHashMismatch).",
            NONZERO_IS_BAD,
        ),
        (
            "Partial files",
            "trainguard_checkpoint_partial_files",
            "In-flight or orphaned .part files. Non-zero during a save is normal; an old one "
            "is CheckpointPartialOrphaned.",
            ((None, "green"), (1, "orange")),
        ),
    ):
        d = d.with_panel(
            stat_panel(
                title,
                desc,
                "none",
                [_target(f"sum({by_loc(metric)}) or vector(0)", title.lower())],
                thresholds=thr,
                w=8,
            )
        )

    d = d.with_row(db.Row("Progress"))
    d = d.with_panel(
        ts(
            "Newest complete step per location",
            "Step of the newest COMPLETE checkpoint per run and location. A mirror lagging "
            "behind the primary shows as a lower line.",
            "none",
            [_target(by_loc("trainguard_checkpoint_last_step"), "{{run}} {{location}}")],
        )
    )
    d = d.with_panel(
        ts(
            "Checkpoint age per location",
            "Seconds since the newest complete checkpoint per run and location was written "
            "(CheckpointStale).",
            "s",
            [
                _target(
                    "time() - " + by_loc("trainguard_checkpoint_last_timestamp_seconds"),
                    "{{run}} {{location}}",
                )
            ],
            minimum=0,
        )
    )

    d = d.with_row(db.Row("Integrity"))
    d = d.with_panel(
        table_panel(
            "Size vs expected (newest checkpoints)",
            "For the newest checkpoints of each location: size on disk, size recorded when it "
            "was written, and their ratio. Below 100% is a truncated file (a 73% mirror passes "
            "a 'bigger than 50 MB' check; it does not pass this one).",
            [
                _target(
                    f"max by (run, location, step) (trainguard_checkpoint_size_bytes{{{IR}}})",
                    ref="A",
                    instant=True,
                    table_format=True,
                ),
                _target(
                    f"max by (run, location, step) "
                    f"(trainguard_checkpoint_expected_size_bytes{{{IR}}})",
                    ref="B",
                    instant=True,
                    table_format=True,
                ),
                _target(
                    f"max by (run, location, step) (trainguard_checkpoint_size_bytes{{{IR}}})\n"
                    f"/ max by (run, location, step) "
                    f"(trainguard_checkpoint_expected_size_bytes{{{IR}}})",
                    ref="C",
                    instant=True,
                    table_format=True,
                ),
            ],
            columns={
                "run": ("Run", ""),
                "location": ("Location", ""),
                "step": ("Step", ""),
                "Value #A": ("Size", "bytes"),
                "Value #B": ("Expected", "bytes"),
                "Value #C": ("Size / expected", "percentunit"),
            },
            w=12,
            h=9,
            extra={
                "Value #C": [
                    DynamicConfigValue(
                        id_val="thresholds",
                        value={
                            "mode": "absolute",
                            "steps": [
                                {"value": None, "color": "red"},
                                {"value": 1, "color": "green"},
                                {"value": 1.0000001, "color": "orange"},
                            ],
                        },
                    ),
                    DynamicConfigValue(
                        id_val="custom.cellOptions", value={"type": "color-background"}
                    ),
                ]
            },
        )
    )
    d = d.with_panel(
        ts(
            "Smallest size / expected per location",
            "Lowest ratio of on-disk size to recorded size among the newest checkpoints of "
            "each location. 100% is healthy; anything below is truncation.",
            "percentunit",
            [
                _target(
                    f"min by (run, location) (\n"
                    f"  trainguard_checkpoint_size_bytes{{{IR}}}\n"
                    f"  / trainguard_checkpoint_expected_size_bytes{{{IR}}}\n"
                    ")",
                    "{{run}} {{location}}",
                )
            ],
            thresholds=((None, "red"), (1, "green")),
            w=12,
            h=9,
        )
    )
    d = d.with_panel(
        ts(
            "Truncated, mismatched and partial files",
            "Problem files per run and location over time.",
            "none",
            [
                _target(
                    by_loc("trainguard_checkpoint_truncated_files"),
                    "{{run}} {{location}} truncated",
                    "A",
                ),
                _target(
                    by_loc("trainguard_checkpoint_hash_mismatch_files"),
                    "{{run}} {{location}} hash mismatch",
                    "B",
                ),
                _target(
                    by_loc("trainguard_checkpoint_partial_files"),
                    "{{run}} {{location}} partial",
                    "C",
                ),
            ],
            minimum=0,
        )
    )
    d = d.with_panel(
        ts(
            "Oldest partial file age",
            "Age of the oldest .part file per run and location. A save in progress is young; "
            "one that keeps ageing was abandoned by a crash (CheckpointPartialOrphaned).",
            "s",
            [
                _target(
                    by_loc("trainguard_checkpoint_oldest_partial_age_seconds"),
                    "{{run}} {{location}}",
                )
            ],
            minimum=0,
        )
    )

    d = d.with_row(db.Row("Storage"))
    d = d.with_panel(
        _dashed(
            ts(
                "Free space and 4h forecast",
                "Free bytes on the volume of each checkpoint location, and the linear forecast "
                "4 hours ahead from the last hour's trend (dashed; predict_linear). A forecast "
                "at or below 0 means the volume fills before then (CheckpointVolumeFillingUp).",
                "bytes",
                [
                    _target(
                        f"min by (run, location) "
                        f"(trainguard_checkpoint_filesystem_avail_bytes{{{IR}}})",
                        "{{run}} {{location}} free",
                        "A",
                    ),
                    _target(
                        f"min by (run, location) (predict_linear("
                        f"trainguard_checkpoint_filesystem_avail_bytes{{{IR}}}[1h], 4 * 3600))",
                        "{{run}} {{location}} forecast +4h",
                        "B",
                    ),
                ],
            ),
            "/forecast/",
        )
    )
    d = d.with_panel(
        ts(
            "Time until volume is full",
            "Free bytes divided by the rate they shrank at over the last hour (only where "
            "they shrink). A rough estimate; it resets when old checkpoints are pruned.",
            "s",
            [
                _target(
                    f"min by (run, location) (\n"
                    f"  trainguard_checkpoint_filesystem_avail_bytes{{{IR}}}\n"
                    f"  / (-deriv(trainguard_checkpoint_filesystem_avail_bytes{{{IR}}}[1h]) > 0)\n"
                    ")",
                    "{{run}} {{location}}",
                )
            ],
            thresholds=((None, "red"), (6 * 3600, "orange"), (24 * 3600, "green")),
            minimum=0,
        )
    )
    d = d.with_panel(
        ts(
            "Checkpoint bytes per location",
            "Total bytes of checkpoint files per run and location.",
            "bytes",
            [_target(by_loc("trainguard_checkpoint_bytes"), "{{run}} {{location}}")],
            minimum=0,
        )
    )
    d = d.with_panel(
        ts(
            "Checkpoint files per location",
            "Number of checkpoint files per run and location (pruning keeps it bounded).",
            "none",
            [_target(by_loc("trainguard_checkpoint_files"), "{{run}} {{location}}")],
            minimum=0,
        )
    )
    return d


# --------------------------------------------------------------------------------------------
# Build and write
# --------------------------------------------------------------------------------------------


def _to_dict(builder: db.Dashboard) -> dict[str, Any]:
    d: dict[str, Any] = json.loads(JSONEncoder(sort_keys=True).encode(builder.build()))
    # Stable, unique panel ids (the SDK leaves them at 0).
    next_id = 1

    def number(panels: list[dict[str, Any]]) -> None:
        nonlocal next_id
        for p in panels:
            p["id"] = next_id
            next_id += 1
            number(p.get("panels", []))

    number(d.get("panels", []))
    return d


def build_dashboards() -> dict[str, dict[str, Any]]:
    """Return ``{filename: dashboard JSON model}`` for every trainguard dashboard."""
    return {
        "trainguard-runs.json": _to_dict(runs_dashboard()),
        "trainguard-gpu-memory.json": _to_dict(gpu_memory_dashboard()),
        "trainguard-checkpoints.json": _to_dict(checkpoints_dashboard()),
    }


def render(dashboard: dict[str, Any]) -> str:
    """Serialise a dashboard the way it is committed."""
    return json.dumps(dashboard, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=DASHBOARD_DIR, help="output directory (default: %(default)s)"
    )
    parser.add_argument(
        "--check", action="store_true", help="do not write; exit 1 if the files are out of date"
    )
    args = parser.parse_args(argv)

    stale = []
    for name, dashboard in build_dashboards().items():
        path = args.out / name
        text = render(dashboard)
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path))
            continue
        args.out.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    if stale:
        print("out of date (run python grafana/generate.py):", *stale, sep="\n  ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
