"""The dashboards draw what pages: every metric an alert reads is on a panel, and no panel carries
a literal threshold that a rule has as a setting.

Both are read from the generated files, independently of the generators' code: the alerts'
metrics from alerts/trainguard.rules.yml (an alert reads the metrics of its expression and,
through the recorded series it reads, of their recording rules), the panels' from the committed
dashboards. A threshold is a *setting* where it changes with the site configuration: the rules
and the dashboards are generated twice, for the defaults and for a site whose every duration,
number and byte size is different, and a value that stays put in a panel while an alert about
the same metrics has it as a setting is a literal that will contradict the alert at the first
site that changes it.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
import yaml

from alerts import build, kinds
from alerts import site as sites
from grafana import generate
from helpers import dashboard_queries as queries
from helpers.paths import REPO

RULES = yaml.safe_load((REPO / "alerts" / "trainguard.rules.yml").read_text(encoding="utf-8"))

#: metrics an alert reads that no dashboard draws, each with the reason
NOT_DRAWN: dict[str, str] = {}

#: (panel title, literal value) pairs that equal an alert's setting by coincidence, with why
COINCIDENCES: dict[tuple[str, float], str] = {
    ("Steps per minute", 300.0): "[5m]: the deriv() window that smooths the drawn rate, the "
    "panel's own (also the steps/min column of Runs now); TrainingThroughputDropped's windows "
    "are its own settings, and the panel draws its baseline from throughput_baseline",
}

_METRIC_RE = re.compile(r"(?<![:\w])(trainguard_\w+)")
_RECORD_RE = re.compile(r"(?<![\w:])([a-z_]+:\w+:\w+)")
_STRING_RE = re.compile(r'"(?:[^"\\\n]|\\.)*"|`[^`]*`')
# a number, or a duration such as 5m or 1h30m, that is not part of a name or a label value
_NUMBER_RE = re.compile(
    r"(?<![\w.:$])((?:\d+(?:\.\d+)?(?:ms|[smhdwy]))+|\d+(?:\.\d+)?(?:e[+-]?\d+)?)(?![\w.])"
)


def _drawn_anywhere(metric: str) -> bool:
    return not (metric.endswith("_info") or metric.endswith("_supported"))


# --------------------------------------------------------------------------------------------
# What the alerts read
# --------------------------------------------------------------------------------------------


def _rules(doc: Mapping[str, Any]) -> Iterable[dict[str, Any]]:
    for group in doc["groups"]:
        yield from group["rules"]


def _alert_exprs(doc: Mapping[str, Any]) -> dict[str, list[str]]:
    """Each alert's expression, then the recording rules it reads, transitively."""
    records: dict[str, list[str]] = {}
    for rule in _rules(doc):
        if "record" in rule:
            records.setdefault(rule["record"], []).append(rule["expr"])
    out: dict[str, list[str]] = {}
    for rule in _rules(doc):
        if "alert" not in rule:
            continue
        exprs, todo, seen = [], [rule["expr"]], set()
        while todo:
            expr = todo.pop()
            exprs.append(expr)
            for name in _RECORD_RE.findall(expr):
                if name in records and name not in seen:
                    seen.add(name)
                    todo.extend(records[name])
        out.setdefault(rule["alert"], []).extend(exprs)
    return out


def alerted_metrics(doc: Mapping[str, Any]) -> dict[str, set[str]]:
    """``{metric: alerts that read it}``."""
    out: dict[str, set[str]] = {}
    for alert, exprs in _alert_exprs(doc).items():
        for expr in exprs:
            for metric in _METRIC_RE.findall(expr):
                out.setdefault(metric, set()).add(alert)
    return out


def drawn_metrics(dashboards: Mapping[str, dict[str, Any]]) -> set[str]:
    return {m for q in queries.extract_queries(dashboards) for m in _METRIC_RE.findall(q.raw)}


def undrawn(doc: Mapping[str, Any], dashboards: Mapping[str, dict[str, Any]]) -> dict[str, str]:
    """``{metric: the alerts reading it}`` for the alerted metrics no panel draws."""
    drawn = drawn_metrics(dashboards)
    return {
        metric: ", ".join(sorted(alerts))
        for metric, alerts in sorted(alerted_metrics(doc).items())
        if _drawn_anywhere(metric) and metric not in drawn and metric not in NOT_DRAWN
    }


def test_every_metric_an_alert_reads_is_drawn() -> None:
    dashboards = queries.load_dashboards()
    alerted = {m for m in alerted_metrics(RULES) if _drawn_anywhere(m)}
    assert len(alerted) > 50  # the rules were read
    assert undrawn(RULES, dashboards) == {}, "draw them, or say in NOT_DRAWN why not"
    stale = {m for m in NOT_DRAWN if m not in alerted or m in drawn_metrics(dashboards)}
    assert stale == set(), "NOT_DRAWN names metrics that are drawn or read by no alert"


def test_the_drawing_check_finds_a_missing_panel() -> None:
    dashboards = copy.deepcopy(queries.load_dashboards())
    runs = dashboards["trainguard-runs.json"]
    for panel in queries.walk_panels(runs["panels"]):
        panel["targets"] = [
            t for t in panel.get("targets", []) if "loss_nonfinite_streak" not in t["expr"]
        ]
    assert undrawn(RULES, dashboards) == {
        # goodput reads it too: steps on a NaN loss are no progress
        "trainguard_run_loss_nonfinite_streak": "TrainingGoodputLow, TrainingLossNonFinite"
    }


# --------------------------------------------------------------------------------------------
# Literal thresholds
# --------------------------------------------------------------------------------------------


def _value(token: str) -> float:
    if re.fullmatch(r"\d+(?:\.\d+)?(?:e[+-]?\d+)?", token):
        return float(token)
    return float(kinds.parse_duration(token))


def numbers(text: str) -> list[float]:
    """The numbers and durations (in seconds) of a PromQL expression, outside label values."""
    return [_value(t) for t in _NUMBER_RE.findall(_STRING_RE.sub('""', text))]


def _changed_site() -> sites.Site:
    """The defaults with every duration, number and byte size seven times as large."""
    overrides: dict[str, object] = {}
    for t in sites.THRESHOLDS:
        if t.kind is kinds.DURATION:
            overrides[t.name] = f"{7 * kinds.parse_duration(t.default)}s"
        elif t.kind is kinds.NUMBER:
            overrides[t.name] = 7 * kinds.parse_number(t.default)
        elif t.kind is kinds.BYTES:
            overrides[t.name] = 7 * kinds.parse_bytes(t.default)
    return sites.Site.of(overrides)


def _pairs(a: list[float], b: list[float], where: str) -> list[tuple[float, float]]:
    assert len(a) == len(b), f"{where}: a different shape for another site"
    return list(zip(a, b, strict=True))


def alert_settings(default: Mapping[str, Any], changed: Mapping[str, Any]) -> dict[str, set[float]]:
    """``{alert: the values in its expressions and for: that come from the site}``."""
    exprs0, exprs1 = _alert_exprs(default), _alert_exprs(changed)
    fors0 = {r["alert"]: r.get("for", "") for r in _rules(default) if "alert" in r}
    fors1 = {r["alert"]: r.get("for", "") for r in _rules(changed) if "alert" in r}
    out: dict[str, set[float]] = {}
    for alert, exprs in exprs0.items():
        a = numbers("\n".join(exprs) + " " + fors0[alert])
        b = numbers("\n".join(exprs1[alert]) + " " + fors1[alert])
        out[alert] = {v0 for v0, v1 in _pairs(a, b, alert) if v0 != v1}
    return out


def _steps(panel: Mapping[str, Any]) -> list[float]:
    """The values of a panel's colour thresholds (its own and its overrides')."""
    config = panel.get("fieldConfig", {})
    steps = [config.get("defaults", {}).get("thresholds", {}).get("steps", [])]
    for override in config.get("overrides", []):
        steps += [p["value"]["steps"] for p in override["properties"] if p["id"] == "thresholds"]
    return [float(s["value"]) for group in steps for s in group if s["value"] is not None]


def _exprs(panel: Mapping[str, Any]) -> list[float]:
    return [v for target in panel.get("targets", []) for v in numbers(target["expr"])]


def _literals(panel: Mapping[str, Any], other: Mapping[str, Any], where: str) -> set[float]:
    """The values of ``panel`` that are the same in ``other`` (the same panel, another site)."""
    return {
        v0
        for part in (_exprs, _steps)
        for v0, v1 in _pairs(part(panel), part(other), where)
        if v0 == v1
    }


def literal_thresholds(
    default: tuple[Mapping[str, Any], Mapping[str, dict[str, Any]]],
    changed: tuple[Mapping[str, Any], Mapping[str, dict[str, Any]]],
) -> list[str]:
    """Panels' values that stay put for another site while an alert has them as a setting.

    ``default`` and ``changed`` are ``(rules, dashboards)`` for the defaults and for the changed
    site. Two ways a panel is about an alert: it names it in its title or description (a panel
    that draws what an alert judges says so; every value of its queries and colours is checked),
    or it draws a metric the alert reads (its colour thresholds are checked, but for the 1 of
    "any is bad" counts).
    """
    settings = alert_settings(default[0], changed[0])
    readers = alerted_metrics(default[0])
    found = []
    for name, board in default[1].items():
        other = {p["id"]: p for p in queries.walk_panels(changed[1][name]["panels"])}
        for panel in queries.walk_panels(board["panels"]):
            if panel["type"] == "row":
                continue
            where = f"{board['uid']} / {panel['title']}"
            literals = _literals(panel, other[panel["id"]], where)
            text = f"{panel['title']} {panel.get('description', '')}"
            named = {a for a in settings if re.search(rf"\b{a}\b", text)}
            metrics = {m for t in panel["targets"] for m in _METRIC_RE.findall(t["expr"])}
            reading = {a for m in metrics for a in readers.get(m, ())}
            colours = set(_steps(panel)) - {1.0}
            for value in sorted(literals):
                if (panel["title"], value) in COINCIDENCES:
                    continue
                about = named | (reading if value in colours else set())
                hits = sorted(a for a in about if value in settings[a])
                if hits:
                    found.append(f"{where}: literal {value:g}, a setting of {', '.join(hits)}")
    return found


@pytest.fixture(scope="module")
def both_sites() -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    changed = _changed_site()
    default_rules = {"groups": build.rule_groups(sites.resolve())}
    changed_rules = {"groups": build.rule_groups(changed.table)}
    return (
        (default_rules, generate.build_dashboards()),
        (changed_rules, generate.build_dashboards(site=changed)),
    )


def test_no_panel_carries_a_literal_threshold_a_rule_has_as_a_setting(
    both_sites: tuple[tuple[Any, Any], tuple[Any, Any]],
) -> None:
    default, changed = both_sites
    assert sum(map(len, alert_settings(default[0], changed[0]).values())) > 100  # real settings
    assert literal_thresholds(default, changed) == []


def test_the_literal_check_finds_a_literal_colour(
    both_sites: tuple[tuple[Any, Any], tuple[Any, Any]],
) -> None:
    """The "Log age" colours as they were: literal 600/1200 s while TrainingLogStale's
    threshold is a setting (30m by default, where 600 s is another of its settings)."""
    default, changed = copy.deepcopy(both_sites)
    for _, boards in (default, changed):
        for panel in queries.walk_panels(boards["trainguard-runs.json"]["panels"]):
            if panel.get("title") == "Log age":
                panel["fieldConfig"]["defaults"]["thresholds"]["steps"] = [
                    {"value": None, "color": "green"},
                    {"value": 600, "color": "orange"},
                    {"value": 1800, "color": "red"},
                ]
    found = literal_thresholds(default, changed)
    assert any(f.startswith("trainguard-runs / Log age: literal 1800, a setting of") for f in found)


def test_numbers() -> None:
    assert numbers('deriv(x{a="5m", b=~"1"}[1h30m]) * 60 > 0.5 offset 6h') == [
        5400.0,
        60.0,
        0.5,
        21600.0,
    ]
    assert numbers("job:trainguard_run_goodput:ratio_24h{x=`7`} < 1e3") == [1000.0]
