"""Extract the PromQL of trainguard's dashboards, ready to run against a real Prometheus.

    from helpers.dashboard_queries import iter_queries   # tests/ is on sys.path
    for uid, title, expr in iter_queries():
        ...  # e.g. GET /api/v1/query?query=expr

Reads the committed JSON in ``grafana/dashboards/`` (what users import), not the generator,
so it needs nothing beyond the standard library. Template variables are replaced by their
"match everything" value: ``$instance``/``$run`` (any dashboard query variable) → ``.*``,
``$__rate_interval``/``$__interval`` → ``1m``, ``$__range`` → ``1h``. ``label_values(sel, l)``
variable queries become their selector ``sel``.

Used by ``tests/generators/test_dashboards.py`` and
``tests/generators/test_dashboards_live.py``; ``python tests/helpers/dashboard_queries.py``
prints every query.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DASHBOARD_DIR = Path(__file__).resolve().parents[2] / "grafana" / "dashboards"

# Values for Grafana's built-in variables, chosen so that queries are valid and cheap.
BUILTIN_VALUES: dict[str, str] = {
    "__rate_interval": "1m",
    "__interval": "1m",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
    "__interval_ms": "60000",
}

# $name, ${name} and ${name:format}; [[name]] is deprecated and not used by the generator.
_VAR_RE = re.compile(r"\$(?:\{(?P<braced>\w+)(?::\w+)?\}|(?P<plain>\w+))")
_LABEL_VALUES_RE = re.compile(r"^\s*label_values\((?P<args>.*)\)\s*$", re.DOTALL)
_QUERY_RESULT_RE = re.compile(r"^\s*query_result\((?P<expr>.*)\)\s*$", re.DOTALL)


@dataclass(frozen=True)
class Query:
    """One PromQL query of a dashboard."""

    dashboard_uid: str
    #: panel title, or ``"variable <name>"`` for a template variable's query
    title: str
    #: ``"panel"`` or ``"variable"``
    kind: str
    #: the query as written in the dashboard (template variables not substituted)
    raw: str
    #: PromQL with template variables substituted; runnable as it is
    expr: str
    #: the panel asks Prometheus for an instant vector (tables, gauges) rather than a range
    instant: bool
    ref_id: str = ""


def load_dashboards(directory: Path | str = DASHBOARD_DIR) -> dict[str, dict[str, Any]]:
    """Return ``{filename: dashboard}`` for every ``*.json`` in ``directory``."""
    return {
        p.name: json.loads(p.read_text(encoding="utf-8"))
        for p in sorted(Path(directory).glob("*.json"))
    }


def dashboard_variables(dashboard: Mapping[str, Any]) -> dict[str, str]:
    """Match-all values for the dashboard's own template variables.

    Query/custom variables take their ``allValue`` (``.*`` here), datasource variables keep a
    placeholder (they never appear inside PromQL).
    """
    values: dict[str, str] = {}
    for var in dashboard.get("templating", {}).get("list", []):
        name = var["name"]
        if var.get("type") == "datasource":
            values[name] = name
        elif var.get("type") in ("constant", "textbox"):
            values[name] = str(var.get("query", ""))
        else:
            values[name] = var.get("allValue") or ".*"
    return values


def substitute(expr: str, variables: Mapping[str, str]) -> str:
    """Replace ``$var``/``${var}``/``${var:fmt}`` using ``variables`` then Grafana's built-ins.

    Raises ``KeyError`` for an unknown variable, so a typo in a dashboard fails loudly.
    """

    def repl(m: re.Match[str]) -> str:
        name = m.group("braced") or m.group("plain")
        if name in variables:
            return variables[name]
        if name in BUILTIN_VALUES:
            return BUILTIN_VALUES[name]
        raise KeyError(f"unknown template variable ${name} in {expr!r}")

    return _VAR_RE.sub(repl, expr)


def variable_query_expr(query: str | Mapping[str, Any]) -> str | None:
    """PromQL behind a Prometheus variable query, or ``None`` when it has none.

    ``label_values(selector, label)`` → ``selector``; ``query_result(expr)`` → ``expr``;
    ``label_values(label)``, ``label_names()`` and ``metrics(...)`` have no expression.
    """
    if isinstance(query, Mapping):
        query = str(query.get("query", ""))
    m = _LABEL_VALUES_RE.match(query)
    if m:
        args = m.group("args")
        if "," not in args:
            return None  # label_values(label): every series, no selector
        selector, _, _label = args.rpartition(",")
        return selector.strip()
    m = _QUERY_RESULT_RE.match(query)
    if m:
        return m.group("expr").strip()
    if re.match(r"^\s*(label_names|metrics)\(", query):
        return None
    return query.strip() or None


def walk_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, rows included, depth first."""
    for panel in panels:
        yield panel
        yield from walk_panels(panel.get("panels", []))  # collapsed rows keep their panels


def extract_queries(
    dashboards: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Query]:
    """Every panel target and every query variable of ``dashboards`` (default: committed)."""
    if dashboards is None:
        dashboards = load_dashboards()
    out: list[Query] = []
    for dashboard in dashboards.values():
        uid = dashboard["uid"]
        variables = dashboard_variables(dashboard)
        for var in dashboard.get("templating", {}).get("list", []):
            if var.get("type") != "query":
                continue
            raw = variable_query_expr(var.get("query", ""))
            if raw is None:
                continue
            out.append(
                Query(
                    uid,
                    f"variable {var['name']}",
                    "variable",
                    raw,
                    substitute(raw, variables),
                    instant=False,
                )
            )
        for panel in walk_panels(dashboard.get("panels", [])):
            for target in panel.get("targets", []):
                raw = target.get("expr")
                if not raw or target.get("hide"):
                    continue
                out.append(
                    Query(
                        uid,
                        panel.get("title", ""),
                        "panel",
                        raw,
                        substitute(raw, variables),
                        instant=bool(target.get("instant")) and not target.get("range"),
                        ref_id=target.get("refId", ""),
                    )
                )
    return out


def iter_queries(
    dashboards: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[tuple[str, str, str]]:
    """``[(dashboard_uid, panel_title, expr), ...]`` with template variables substituted.

    Variable queries appear with the title ``"variable <name>"``.
    """
    return [(q.dashboard_uid, q.title, q.expr) for q in extract_queries(dashboards)]


if __name__ == "__main__":
    for uid, title, expr in iter_queries():
        print(f"# {uid} / {title}\n{expr}\n")
