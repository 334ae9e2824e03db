"""Grafana dashboards: generated JSON is committed and current, well-formed, and every query parses.

The PromQL check uses the real ``promtool`` (Debian package ``prometheus``): every panel and
variable query becomes a recording rule in a temporary rule file and ``promtool check rules``
parses it. Running the queries against a Prometheus fed by the real exporter is a separate test
(``tests/generators/test_dashboards_live.py``) built on
:func:`helpers.dashboard_queries.iter_queries`.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml

from grafana import generate
from helpers import dashboard_queries as queries
from helpers.paths import REPO
from trainguard.exporter.collectors import COLLECTORS
from trainguard.exporter.scrape.collector import FRAMEWORK_METRICS

UIDS = {
    "trainguard-runs": "Training runs",
    "trainguard-gpu-memory": "GPU memory",
    "trainguard-checkpoints": "Checkpoints",
}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# The metric contract (docs/metrics.md, checked against the code by test_metrics_doc.py), from
# the code's own specs. Metrics with a `run` label must be filtered on $run.
_CONTRACT = [*FRAMEWORK_METRICS, *(spec for c in COLLECTORS for spec in c.metrics)]
METRICS_WITH_RUN = {spec.name for spec in _CONTRACT if "run" in spec.labels}
METRICS_WITHOUT_RUN = {spec.name for spec in _CONTRACT if "run" not in spec.labels}
BYTE_UNITS = {"bytes", "decbytes", "percentunit"}  # a ratio of two byte counts is a percentage
TIME_UNITS = {"s", "ms", "dtdurations", "dateTimeAsIso"}

# Every alert of the rules file that tells of a problem, read here independently of the
# generator: the dashboards' "Firing trainguard alerts" table must show exactly these (not the
# always-firing Watchdog, severity none).
RULES_TEXT = (REPO / "alerts" / "trainguard.rules.yml").read_text(encoding="utf-8")
RULES = yaml.safe_load(RULES_TEXT)
RULE_ALERTS = sorted(
    {
        r["alert"]
        for g in RULES["groups"]
        for r in g["rules"]
        if "alert" in r and r["labels"]["severity"] != "none"
    }
)

# metric name, then optional {matchers}; PromQL keywords and functions never start with these
# (a recorded series, ``job:trainguard_run_goodput:ratio_24h``, is not the exporter's)
_SELECTOR_RE = re.compile(r"(?<![:\w])(trainguard_\w+|ALERTS|up|job:\w+:\w+)\b(\{[^}]*\})?")


@pytest.fixture(scope="module")
def generated() -> dict[str, dict[str, Any]]:
    return generate.build_dashboards()


@pytest.fixture(scope="module")
def committed() -> dict[str, dict[str, Any]]:
    return queries.load_dashboards()


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return list(queries.walk_panels(dashboard["panels"]))


def _query_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in _panels(dashboard) if p["type"] != "row"]


def _all_query_panels(dashboards: dict[str, dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(d["uid"], p) for d in dashboards.values() for p in _query_panels(d)]


def _units(panel: dict[str, Any]) -> set[str]:
    fc = panel.get("fieldConfig", {})
    units = {fc.get("defaults", {}).get("unit")}
    for override in fc.get("overrides", []):
        units |= {p.get("value") for p in override["properties"] if p["id"] == "unit"}
    return {u for u in units if u}


# --- (a) staleness ----------------------------------------------------------------------------


def test_committed_json_matches_generator(generated: dict[str, dict[str, Any]]) -> None:
    on_disk = sorted(p.name for p in generate.DASHBOARD_DIR.glob("*.json"))
    assert on_disk == sorted(generated), "run: python grafana/generate.py"
    for name, dashboard in generated.items():
        text = (generate.DASHBOARD_DIR / name).read_text(encoding="utf-8")
        assert text == generate.render(dashboard), f"{name} is stale: python grafana/generate.py"


def test_generate_check_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert generate.main(["-o", str(tmp_path)]) == 0
    assert generate.main(["--check", "--output", str(tmp_path)]) == 0
    victim = next(tmp_path.glob("*.json"))
    victim.write_text("{}\n", encoding="utf-8")
    capsys.readouterr()
    assert generate.main(["--check", "-o", str(tmp_path)]) == 1
    assert victim.read_text(encoding="utf-8") == "{}\n"  # --check writes nothing
    assert f"{victim} is stale: run python grafana/generate.py" in capsys.readouterr().err


def test_generate_rejects_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert generate.main(["-o", "-"]) == 2  # three files do not go to one stream
    assert capsys.readouterr().err.startswith("grafana/generate.py: error: ")


def test_generate_runs_as_a_script_from_anywhere(tmp_path: Path) -> None:
    script = REPO / "grafana" / "generate.py"
    result = subprocess.run(
        [sys.executable, str(script), "--check"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


def test_generate_without_the_sdk_says_what_to_install(tmp_path: Path) -> None:
    """A plain install (no `dashboards` extra): one line naming the extra, not a traceback."""
    script = REPO / "grafana" / "generate.py"
    hide_sdk = (
        "import runpy, sys; sys.modules['grafana_foundation_sdk'] = None; "
        f"sys.argv = [{str(script)!r}, '-o', {str(tmp_path)!r}]; "
        f"runpy.run_path({str(script)!r}, run_name='__main__')"
    )
    result = subprocess.run(
        [sys.executable, "-c", hide_sdk], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"grafana/generate.py: error: {generate.INSTALL_HINT}\n"
    assert "pip install '.[dashboards]'" in result.stderr
    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    sdk = extras["project"]["optional-dependencies"]["dashboards"]
    assert [d for d in sdk if d.startswith("grafana-foundation-sdk==")] == sdk
    assert list(tmp_path.iterdir()) == []


def test_alert_names_come_from_the_rules_file(tmp_path: Path) -> None:
    assert generate.alert_names() == RULE_ALERTS
    rules = tmp_path / "rules.yml"
    rules.write_text(
        "groups:\n- name: g\n  rules:\n  - alert: B\n    expr: up\n  - record: r\n"
        "    expr: up\n  - alert: A\n    expr: up\n  - alert: B\n    expr: up\n",
        encoding="utf-8",
    )
    assert generate.alert_names(rules) == ["A", "B"]
    rules.write_text(
        "groups:\n- name: g\n  rules:\n  - alert: Watchdog\n    expr: vector(1)\n"
        "    labels: {severity: none}\n  - alert: A\n    expr: up\n",
        encoding="utf-8",
    )
    assert generate.alert_names(rules) == ["A"]  # the always-firing Watchdog is no problem
    rules.write_text("groups: []\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no alerting rules"):
        generate.alert_names(rules)
    rules.write_text("groups:\n- name: g\n  rules:\n  - alert: 'A|B'\n", encoding="utf-8")
    with pytest.raises(ValueError, match="not a plain identifier"):
        generate.build_dashboards(rules)


# --- (b) structure ----------------------------------------------------------------------------


def test_uids_titles_and_files(committed: dict[str, dict[str, Any]]) -> None:
    assert {d["uid"]: d["title"] for d in committed.values()} == UIDS
    for name, d in committed.items():
        assert name == f"{d['uid']}.json"
        assert "trainguard" in d["tags"]
        assert d["schemaVersion"] >= 41  # Grafana 11.6
        assert d.get("description")


def test_template_variables(committed: dict[str, dict[str, Any]]) -> None:
    for d in committed.values():
        variables = {v["name"]: v for v in d["templating"]["list"]}
        assert list(variables) == ["datasource", "cluster", "instance", "run"], d["uid"]
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        cluster, inst, run = variables["cluster"], variables["instance"], variables["run"]
        assert cluster["query"] == "label_values(trainguard_exporter_build_info, cluster)"
        assert inst["query"] == (
            'label_values(trainguard_exporter_build_info{cluster=~"$cluster"}, instance)'
        )
        assert run["query"] == (
            'label_values(trainguard_run_info{cluster=~"$cluster", instance=~"$instance"}, run)'
        )
        for v in (cluster, inst, run):
            assert v["type"] == "query"
            assert v["datasource"] == DATASOURCE
            assert v["multi"] is True and v["includeAll"] is True
            assert v["allValue"] == ".*"  # so "All" is a regex, not a huge alternation
            assert v["refresh"] == 2  # on time range change: runs come and go


def test_every_panel_has_description_and_datasource(committed: dict[str, dict[str, Any]]) -> None:
    for uid, panel in _all_query_panels(committed):
        where = f"{uid} / {panel.get('title')}"
        assert panel.get("title"), where
        assert len(panel.get("description", "")) >= 20, f"{where}: needs a description"
        assert panel.get("datasource") == DATASOURCE, where
        assert panel.get("targets"), f"{where}: no query"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert all(ref_ids) and len(set(ref_ids)) == len(ref_ids), where
        for target in panel["targets"]:
            assert target.get("datasource") == DATASOURCE, where
            assert target.get("expr"), where


def test_units(committed: dict[str, dict[str, Any]]) -> None:
    for uid, panel in _all_query_panels(committed):
        where = f"{uid} / {panel['title']}"
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{where}: no unit"
        exprs = " ".join(t["expr"] for t in panel["targets"])
        units = _units(panel)
        bytes_per_rate = "deriv(" in exprs and units == {"s"}  # bytes / (bytes/s): a duration
        if re.search(r"trainguard_\w+_bytes\b", exprs) and not bytes_per_rate:
            assert units & BYTE_UNITS, f"{where}: shows bytes, units {units}"
        if re.search(r"trainguard_\w+_seconds\b", exprs) or "time()" in exprs:
            assert units & TIME_UNITS, f"{where}: shows seconds, units {units}"
        if re.search(r"_timestamp_seconds\b[^\n]*\* 1000", exprs):
            assert "dateTimeAsIso" in units, f"{where}: timestamps shown as dates"


def test_every_selector_filters_instance_and_run(committed: dict[str, dict[str, Any]]) -> None:
    known = METRICS_WITH_RUN | METRICS_WITHOUT_RUN
    for q in queries.extract_queries(committed):
        where = f"{q.dashboard_uid} / {q.title}: {q.raw}"
        selectors = _SELECTOR_RE.findall(q.raw)
        assert selectors, where
        for metric, matchers in selectors:
            if metric.startswith("job:"):  # a job's series recorded by the rules
                assert f"record: {metric}" in RULES_TEXT, f"{where}: {metric} is not recorded"
            elif metric.startswith("trainguard_"):
                assert metric in known, f"{where}: {metric} is not in the metric contract"
            if q.kind == "variable" and q.title == "variable cluster":
                continue  # the $cluster variable itself
            assert 'cluster=~"$cluster' in matchers, f"{where}: {metric} not filtered on $cluster"
            if q.kind == "variable" and q.title == "variable instance":
                continue  # the $instance variable itself
            assert 'instance=~"$instance' in matchers, (
                f"{where}: {metric} not filtered on $instance"
            )
            if q.title == "variable run":
                continue  # the $run variable itself
            if metric in METRICS_WITH_RUN or metric == "ALERTS":
                assert 'run=~"$run' in matchers, f"{where}: {metric} not filtered on $run"


_GROUPING_RE = re.compile(r"\b(by|on) \(([^)]*)\)")


def test_every_aggregation_and_join_keeps_cluster_and_namespace(
    committed: dict[str, dict[str, Any]],
) -> None:
    """A run spans exporters but never two clusters or namespaces: aggregated by ``run``
    alone, a ``llama-ft`` in staging and one in production would be drawn as one line (and a
    join ``on (run)`` between them would fail as many-to-many)."""
    seen = 0
    for q in queries.extract_queries(committed):
        for keyword, labels in _GROUPING_RE.findall(q.raw):
            seen += 1
            names = [name.strip() for name in labels.split(",")]
            assert names[:2] == ["cluster", "namespace"], (
                f"{q.dashboard_uid} / {q.title}: {keyword} ({labels}) in {q.raw}"
            )
    assert seen > 40  # the check saw the dashboards' aggregations


def test_panel_ids_and_layout(committed: dict[str, dict[str, Any]]) -> None:
    for d in committed.values():
        panels = _panels(d)
        ids = [p["id"] for p in panels]
        assert len(set(ids)) == len(ids) and min(ids) > 0, d["uid"]
        cells: set[tuple[int, int]] = set()
        for p in panels:
            g = p["gridPos"]
            assert g["x"] >= 0 and g["x"] + g["w"] <= 24, (d["uid"], p["title"])
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    assert (x, y) not in cells, f"{d['uid']}: {p['title']} overlaps"
                    cells.add((x, y))


def test_expected_panels_present(committed: dict[str, dict[str, Any]]) -> None:
    by_uid = {d["uid"]: {p["title"]: p for p in _query_panels(d)} for d in committed.values()}
    runs = by_uid["trainguard-runs"]
    alerts = runs["Firing trainguard alerts"]["targets"][0]["expr"]
    alternatives = alerts.split('alertname=~"')[1].split('"')[0]
    assert alternatives.split("|") == RULE_ALERTS  # every alert of the rules, and only those
    for name in RULE_ALERTS:
        assert re.fullmatch(alternatives, name), name
    assert runs["Run state per rank"]["type"] == "state-timeline"
    stuck = runs["Where stuck ranks are"]
    assert stuck["type"] == "table"
    exprs = [t["expr"] for t in stuck["targets"]]
    assert any("trainguard_run_stuck_info{" in e and "where, collective" in e for e in exprs)
    gpu = by_uid["trainguard-gpu-memory"]
    ghost = gpu["Driver vs allocator memory per rank"]["targets"]
    assert any("ghost gap" in t["legendFormat"] for t in ghost)
    ckpt = by_uid["trainguard-checkpoints"]
    forecast = ckpt["Free space and 24h forecast"]["targets"]  # volume_fill_horizon
    assert any("predict_linear" in t["expr"] and "[6h], 86400)" in t["expr"] for t in forecast)


# --- query extraction -------------------------------------------------------------------------


def test_iter_queries_covers_every_target(committed: dict[str, dict[str, Any]]) -> None:
    got = queries.iter_queries(committed)
    n_targets = sum(len(p["targets"]) for _, p in _all_query_panels(committed))
    assert len(got) == n_targets + 3 * len(committed)  # + the cluster, instance, run variables
    for uid, title, expr in got:
        assert uid in UIDS and title
        assert "$" not in expr, (uid, title, expr)
    assert (
        "trainguard-runs",
        "variable run",
        'trainguard_run_info{cluster=~".*", instance=~".*"}',
    ) in got
    assert queries.iter_queries() == got  # default: the committed files


def test_substitute() -> None:
    variables = {"instance": ".*", "run": ".*"}
    assert queries.substitute('x{instance=~"$instance"}', variables) == 'x{instance=~".*"}'
    assert queries.substitute('x{run=~"${run}"}', variables) == 'x{run=~".*"}'
    assert queries.substitute('x{run=~"${run:regex}"}', variables) == 'x{run=~".*"}'
    assert queries.substitute("rate(x[$__rate_interval])", variables) == "rate(x[1m])"
    assert queries.substitute("increase(x[$__range])", variables) == "increase(x[1h])"
    with pytest.raises(KeyError, match="nope"):
        queries.substitute("x{a=~'$nope'}", variables)


@pytest.mark.parametrize(
    ("query", "expr"),
    [
        ("label_values(up, instance)", "up"),
        ('label_values(x{a=~"$a", b="c,d"}, run)', 'x{a=~"$a", b="c,d"}'),
        ({"query": "label_values(up, job)", "refId": "A"}, "up"),
        ("query_result(sum(up))", "sum(up)"),
        ("label_values(instance)", None),
        ("label_names()", None),
    ],
)
def test_variable_query_expr(query: Any, expr: str | None) -> None:
    assert queries.variable_query_expr(query) == expr


# --- (c) PromQL syntax with the real promtool -------------------------------------------------


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: install the Debian package 'prometheus'")
    return path


def _check_rules(tmp_path: Path, exprs: list[str]) -> subprocess.CompletedProcess[str]:
    rules = {
        "groups": [
            {
                "name": "dashboard_queries",
                "rules": [
                    {"record": f"dashboard_query_{i}", "expr": e} for i, e in enumerate(exprs)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard_queries.rules.yml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")
    return subprocess.run(
        [_promtool(), "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_every_query_parses_with_promtool(
    tmp_path: Path, committed: dict[str, dict[str, Any]]
) -> None:
    got = queries.iter_queries(committed)
    result = _check_rules(tmp_path, [expr for _, _, expr in got])
    if result.returncode != 0:
        # Say which query: promtool names the failing rule by index.
        listing = "\n".join(
            f"dashboard_query_{i}: {u} / {t}: {e}" for i, (u, t, e) in enumerate(got)
        )
        pytest.fail(f"promtool check rules failed:\n{result.stdout}{result.stderr}\n{listing}")
    assert f"SUCCESS: {len(got)} rules found" in result.stdout


def test_promtool_check_rejects_bad_promql(tmp_path: Path) -> None:
    """The syntax check is not vacuous: promtool does fail on broken PromQL."""
    result = _check_rules(tmp_path, ['sum by (run) (trainguard_run_step{run=~".*"}'])
    assert result.returncode != 0


def test_json_is_plain_grafana_model(committed: dict[str, dict[str, Any]]) -> None:
    """Nothing SDK-specific leaks into the files: they import into Grafana as they are."""
    for name in committed:
        text = (generate.DASHBOARD_DIR / name).read_text(encoding="utf-8")
        assert json.loads(text) == committed[name]
        assert "grafana_foundation_sdk" not in text and "_internal" not in text
        assert '"id": null' not in text


def test_same_named_runs_of_two_clusters_stay_two(
    tmp_path: Path, committed: dict[str, dict[str, Any]]
) -> None:
    """Evaluated by promtool over series from two clusters that both run ``llama-ft`` (All
    clusters selected): the step panel draws two lines, and the steps-at-risk join pairs each
    cluster's step with its own checkpoint instead of failing as many-to-many."""
    exprs = {title: expr for uid, title, expr in queries.iter_queries(committed)}
    step, at_risk = exprs["Step"], exprs["Steps since last complete checkpoint"]
    target = {"namespace": "ml", "job": "trainguard", "instance": "node0:9636", "run": "llama-ft"}

    def series(name: str, cluster: str, value: int, **labels: str) -> dict[str, str]:
        inner = ",".join(f'{k}="{v}"' for k, v in {**target, "cluster": cluster, **labels}.items())
        return {"series": f"{name}{{{inner}}}", "values": f"{value}x10"}

    def sample(value: int, cluster: str, **labels: str) -> dict[str, Any]:
        both = {"cluster": cluster, "namespace": "ml", "run": "llama-ft", **labels}
        inner = ",".join(f'{k}="{v}"' for k, v in both.items())
        return {"labels": f"{{{inner}}}", "value": value}

    doc = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    series("trainguard_run_step", "staging", 100, rank="0"),
                    series("trainguard_run_step", "prod", 200, rank="0"),
                    series("trainguard_checkpoint_last_step", "staging", 90, location="primary"),
                    series("trainguard_checkpoint_last_step", "prod", 150, location="primary"),
                ],
                "promql_expr_test": [
                    {
                        "expr": step,
                        "eval_time": "5m",
                        "exp_samples": [
                            sample(100, "staging", rank="0"),
                            sample(200, "prod", rank="0"),
                        ],
                    },
                    {
                        "expr": at_risk,
                        "eval_time": "5m",
                        "exp_samples": [
                            sample(10, "staging", location="primary"),
                            sample(50, "prod", location="primary"),
                        ],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "two_clusters_test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    result = subprocess.run(
        [_promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
