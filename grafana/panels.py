"""The panel builders every trainguard dashboard is made of, over grafana-foundation-sdk.

They target the Grafana 11.6 schema: time series, stats, bar gauges, tables and state
timelines, and their queries and field settings.

The builders take the few things that differ between panels (title, description, unit,
queries, size, thresholds) and fix everything else, so the dashboards look alike. What the
queries filter on and keep is :mod:`grafana.promql`; the dashboard around the panels (variables,
links, rows) is :mod:`grafana.dashboard`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
from grafana_foundation_sdk.cog import variants
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as models
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    DataTransformerConfig,
    DynamicConfigValue,
    FieldColorModeId,
    Threshold,
    ThresholdsMode,
    ValueMap,
    ValueMappingResult,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

#: Any panel builder a dashboard row accepts.
Panel = Builder[models.Panel]
#: A panel target as the panel builders take it.
Target = Builder[variants.Dataquery]
#: One query of a panel: ``(PromQL, legend)``.
Query = tuple[str, str]
#: Threshold steps ``(from value, colour)``; the first value is ``None`` (minus infinity).
Steps = Sequence[tuple[float | None, str]]

#: The Prometheus data source, chosen by the ``$datasource`` variable.
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")

OK_THRESHOLDS: Steps = ((None, "green"),)
NONZERO_IS_BAD: Steps = ((None, "green"), (1, "red"))


def value_mappings(*texts: tuple[str, str]) -> list[Any]:
    """Value mappings ``0 → texts[0]``, ``1 → texts[1]``... each ``(text, colour)``."""
    return [
        ValueMap(
            options={
                str(i): ValueMappingResult(text=text, color=color, index=i)
                for i, (text, color) in enumerate(texts)
            }
        )
    ]


# --------------------------------------------------------------------------------------------
# Queries and field settings
# --------------------------------------------------------------------------------------------


def target(
    expr: str,
    legend: str = "__auto",
    ref: str = "A",
    *,
    instant: bool = False,
    table_format: bool = False,
) -> prometheus.Dataquery:
    """One Prometheus query of a panel."""
    q = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DS)
    q = q.instant() if instant else q.range()
    if table_format:
        q = q.format(PromQueryFormat.TABLE)
    return q


def _ref(i: int) -> str:
    return chr(ord("A") + i)


def _series(queries: Sequence[Query]) -> list[Target]:
    """Range queries with reference ids A, B, C... in order."""
    return [target(expr, legend, _ref(i)) for i, (expr, legend) in enumerate(queries)]


def _instant_tables(exprs: Sequence[str]) -> list[Target]:
    """Instant queries in table format with reference ids A, B, C... in order."""
    return [
        target(expr, ref=_ref(i), instant=True, table_format=True) for i, expr in enumerate(exprs)
    ]


def threshold_config(*steps: tuple[float | None, str]) -> db.ThresholdsConfig:
    """Absolute thresholds from ``(from value, colour)`` steps."""
    return (
        db.ThresholdsConfig()
        .mode(ThresholdsMode.ABSOLUTE)
        .steps([Threshold(value=v, color=c) for v, c in steps])
    )


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


def _last_value() -> common_builders.ReduceDataOptions:
    return common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False)


# --------------------------------------------------------------------------------------------
# Panels
# --------------------------------------------------------------------------------------------


def ts(
    title: str,
    description: str,
    unit: str,
    queries: Sequence[Query],
    *,
    w: int = 12,
    h: int = 8,
    thresholds: Steps = OK_THRESHOLDS,
    bars: bool = False,
    stacked: bool = False,
    minimum: float | None = None,
    dashed: str | None = None,
    colors: Mapping[str, str] | None = None,
) -> timeseries.Panel:
    """A time series panel.

    Thresholds other than the all-green default are drawn as dashed lines (where an alert
    judges), not only as colours. ``dashed`` is a regexp of series drawn as a dashed line
    without fill (a limit, a forecast); ``colors`` maps a series regexp to a fixed colour.
    """
    p = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .targets(_series(queries))
        .span(w)
        .height(h)
        .legend(_legend())
        .tooltip(_tooltip())
        .thresholds(threshold_config(*thresholds))
        .color_scheme(db.FieldColor().mode(FieldColorModeId.PALETTE_CLASSIC))
        .fill_opacity(10)
        .line_width(1)
        .span_nulls(False)
    )
    if tuple(thresholds) != tuple(OK_THRESHOLDS):
        p = p.thresholds_style(
            common_builders.GraphThresholdsStyleConfig().mode(
                common.GraphThresholdsStyleMode.DASHED
            )
        )
    if bars:
        p = p.draw_style(common.GraphDrawStyle.BARS).fill_opacity(60)
    if stacked:
        p = p.stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
    if minimum is not None:
        p = p.min(minimum)
    if dashed is not None:
        p = p.override_by_regexp(
            dashed,
            [
                DynamicConfigValue(
                    id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}
                ),
                DynamicConfigValue(id_val="custom.fillOpacity", value=0),
                DynamicConfigValue(id_val="custom.stacking", value={"mode": "none", "group": "A"}),
            ],
        )
    for regexp, color in (colors or {}).items():
        p = p.override_by_regexp(
            regexp,
            [DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": color})],
        )
    return p


def stat_panel(
    title: str,
    description: str,
    unit: str,
    query: Query,
    *,
    w: int = 6,
    h: int = 4,
    thresholds: Steps = OK_THRESHOLDS,
) -> stat.Panel:
    """A single-value panel (last value) of one query."""
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .targets(_series([query]))
        .span(w)
        .height(h)
        .thresholds(threshold_config(*thresholds))
        .color_mode(common.BigValueColorMode.BACKGROUND)
        .graph_mode(common.BigValueGraphMode.NONE)
        .text_mode(common.BigValueTextMode.VALUE_AND_NAME)
        .reduce_options(_last_value())
    )


def bar_gauge(
    title: str,
    description: str,
    unit: str,
    query: Query,
    *,
    minimum: float,
    maximum: float,
    thresholds: Steps = OK_THRESHOLDS,
    w: int = 6,
    h: int = 8,
) -> bargauge.Panel:
    """Horizontal bars of the last value of each series of one instant query."""
    expr, legend = query
    return (
        bargauge.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .min(minimum)
        .max(maximum)
        .targets([target(expr, legend, instant=True)])
        .thresholds(threshold_config(*thresholds))
        .span(w)
        .height(h)
        .orientation(common.VizOrientation.HORIZONTAL)
        .reduce_options(_last_value())
    )


def table_panel(
    title: str,
    description: str,
    exprs: Sequence[str],
    *,
    columns: Mapping[str, tuple[str, str]],
    hide: Sequence[str] = (),
    w: int = 24,
    h: int = 8,
    thresholds: Steps = OK_THRESHOLDS,
    extra: Mapping[str, Sequence[DynamicConfigValue]] | None = None,
) -> table.Panel:
    """A table of instant queries (reference ids A, B, C...) merged on their labels.

    ``columns`` maps a field name (``Value #B``, or a label) to ``(display name, unit)``;
    ``hide`` lists fields not shown; ``extra`` adds field properties (mappings, cell colours).
    """
    excluded = {"Time": True, "__name__": True, "job": True}
    excluded.update({name: True for name in hide})
    p = (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit("none")
        .targets(_instant_tables(exprs))
        .span(w)
        .height(h)
        .thresholds(threshold_config(*thresholds))
        .with_transformation(DataTransformerConfig(id_val="merge", options={}))
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
    query: Query,
    mappings: list[Any],
    *,
    w: int = 24,
    h: int = 8,
) -> statetimeline.Panel:
    """One coloured band per series, its state named by ``mappings``."""
    return (
        statetimeline.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit("none")
        .targets(_series([query]))
        .span(w)
        .height(h)
        .mappings(mappings)
        .thresholds(threshold_config((None, "text")))
        .color_scheme(db.FieldColor().mode(FieldColorModeId.THRESHOLDS))
        .show_value(common.VisibilityMode.AUTO)
        .merge_values(True)
        .row_height(0.8)
        .fill_opacity(80)
    )
