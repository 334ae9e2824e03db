"""The dashboard around the panels, the same for every trainguard dashboard.

The template variables (``$datasource``, ``$cluster``, ``$instance``, ``$run``), the links
between the dashboards, the settings, and the rows of panels laid out left to right.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DashboardLinkType,
    DataSourceRef,
    VariableOption,
    VariableRefresh,
    VariableSort,
)

from grafana.panels import DS, Panel
from grafana.promql import I


def _query_variable(name: str, label: str, description: str, query: str) -> Any:
    """A multi-select label variable whose "All" is ``.*``, refreshed with the time range.

    It refreshes with the time range because runs come and go.
    """
    return (
        db.QueryVariable(name)
        .label(label)
        .description(description)
        .datasource(DS)
        .query(query)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(VariableOption(selected=True, text=["All"], value=["$__all"]))
    )


def _variables() -> list[Any]:
    """The template variables ``$datasource``, ``$cluster``, ``$instance`` and ``$run``.

    "All" is ``.*`` (a regex, not a huge alternation); the lists refresh with the time range
    because runs come and go.
    """
    return [
        db.DatasourceVariable("datasource")
        .label("Data source")
        .description("Prometheus that scrapes the trainguard exporters.")
        .type("prometheus"),
        _query_variable(
            "cluster",
            "Cluster",
            "The `cluster` label of the trainguard series (an external label or a target label "
            "of your Prometheus setup); empty where there is none.",
            "label_values(trainguard_exporter_build_info, cluster)",
        ),
        _query_variable(
            "instance",
            "Exporter",
            "trainguard exporter (one per GPU host).",
            'label_values(trainguard_exporter_build_info{cluster=~"$cluster"}, instance)',
        ),
        _query_variable(
            "run",
            "Run",
            "Training run (the `run` label), across the selected exporters.",
            f"label_values(trainguard_run_info{{{I}}}, run)",
        ),
    ]


def dashboard(
    uid: str, title: str, description: str, rows: Sequence[tuple[str, Sequence[Panel]]]
) -> db.Dashboard:
    """A trainguard dashboard: the shared variables, links and settings, then the rows of panels.

    ``rows`` are ``(row title, panels)``, each panel placed left to right, wrapping at the grid's
    width.
    """
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
        .annotation(
            db.AnnotationQuery()
            .name("Annotations & Alerts")
            .datasource(DataSourceRef(type_val="grafana", uid="-- Grafana --"))
            .enable(True)
            .hide(True)
            .icon_color("rgba(0, 211, 255, 1)")
            .type("dashboard")
            .built_in(1)
        )
    )
    for v in _variables():
        d = d.with_variable(v)
    for row_title, panels in rows:
        d = d.with_row(db.Row(row_title))
        for panel in panels:
            d = d.with_panel(panel)
    return d
