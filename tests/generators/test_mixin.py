"""The monitoring mixin (mixin/) evaluates, with the real jsonnet, to exactly the shipped rules and
dashboards, is current, and does what its ``_config`` says: the settings it can change in jsonnet
change what the generators would, and a changed threshold is an error that says to regenerate.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import _jsonnet
import pytest
import yaml

from alerts import build as rules_build
from helpers.paths import REPO
from mixin import build

MIXIN = REPO / "mixin"
RULES = yaml.safe_load((REPO / "alerts" / "trainguard.rules.yml").read_text(encoding="utf-8"))
DASHBOARDS = {
    p.name: json.loads(p.read_text(encoding="utf-8"))
    for p in sorted((REPO / "grafana" / "dashboards").glob("*.json"))
}
WIKI = "https://wiki.example.com/trainguard"
SELECTOR = 'job="gpu-sidecar"'


def evaluate(config: str = "{}", mixin: Path = MIXIN) -> dict[str, Any]:
    """The mixin's three objects and its ``_config``, with ``config`` added to ``_config``."""
    code = (
        f"local m = (import 'mixin.libsonnet') + {{ _config+:: {config} }};\n"
        "{ alerts: m.prometheusAlerts, rules: m.prometheusRules, "
        "dashboards: m.grafanaDashboards, config: m._config }"
    )
    # the snippet's imports are relative to its name: a file beside mixin.libsonnet
    out: dict[str, Any] = json.loads(_jsonnet.evaluate_snippet(str(mixin / "eval.jsonnet"), code))
    return out


def groups(evaluated: dict[str, Any]) -> list[dict[str, Any]]:
    """prometheusAlerts' and prometheusRules' groups, in the rules file's order."""
    both = evaluated["alerts"]["groups"] + evaluated["rules"]["groups"]
    by_name = {g["name"]: g for g in both}
    assert len(by_name) == len(both), "a group name twice: Prometheus refuses the file"
    order = [g["name"] for g in RULES["groups"]]
    return sorted(both, key=lambda g: order.index(g["name"]) if g["name"] in order else -1)


@pytest.fixture(scope="module")
def default() -> dict[str, Any]:
    return evaluate()


def test_committed_mixin_is_current() -> None:
    assert build.main(["--check"]) == 0, "run: python mixin/build.py"


def test_check_finds_a_stale_mixin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert build.main(["-o", str(tmp_path)]) == 0
    assert build.main(["--check", "-o", str(tmp_path)]) == 0
    (tmp_path / "rules.json").write_text("{}\n", encoding="utf-8")
    capsys.readouterr()
    assert build.main(["--check", "-o", str(tmp_path)]) == 1
    assert f"{tmp_path / 'rules.json'} is stale: run python mixin/build.py" in (
        capsys.readouterr().err
    )


def test_mixin_is_the_shipped_rules_and_dashboards(default: dict[str, Any]) -> None:
    assert groups(default) == RULES["groups"]
    for group in default["alerts"]["groups"]:
        assert all("alert" in rule for rule in group["rules"]), group["name"]
    for group in default["rules"]["groups"]:
        assert any("record" in rule for rule in group["rules"]), group["name"]
    assert default["dashboards"] == DASHBOARDS


def test_config_holds_the_site_settings(default: dict[str, Any]) -> None:
    config = default["config"]
    assert config["thresholds"]["stall"] == "10m"
    assert config["thresholds"]["target_labels"] == "cluster, namespace, job, instance"
    assert "job_selector" not in config["thresholds"]  # changed in jsonnet: jobSelector
    assert config["jobSelector"] == 'job=~"trainguard.*"'
    assert config["runbookBase"] is None
    assert config["dashboardTags"] == ["trainguard"]


def test_job_selector_and_runbook_base_as_the_rules_generator_writes_them() -> None:
    """What ``_config`` changes in jsonnet is what ``alerts/build.py --set`` would write."""
    got = evaluate(f"{{ jobSelector: {json.dumps(SELECTOR)}, runbookBase: {json.dumps(WIKI)} }}")
    site = yaml.safe_load(rules_build.render({"job_selector": SELECTOR, "runbook_base": WIKI}))
    assert groups(got) == site["groups"]
    assert groups(got) != RULES["groups"]  # it did change something


def test_alert_labels_and_dashboard_settings() -> None:
    got = evaluate(
        "{ alertLabels: { team: 'ml-infra' }, dashboardTags: ['ml', 'trainguard'], "
        "dashboardRefresh: '1m', dashboardTimezone: 'utc' }"
    )
    for group in groups(got):
        for rule in group["rules"]:
            if "alert" in rule:
                assert rule["labels"]["team"] == "ml-infra", rule["alert"]
                assert rule["labels"]["severity"], rule["alert"]  # added to, not replaced
            else:
                assert "labels" not in rule or "team" not in rule["labels"], rule["record"]
    for name, board in got["dashboards"].items():
        assert board["tags"] == ["ml", "trainguard"]
        assert [link["tags"] for link in board["links"]] == [["ml", "trainguard"]]  # follow
        assert (board["refresh"], board["timezone"]) == ("1m", "utc")
        assert board["panels"] == DASHBOARDS[name]["panels"]


def test_a_changed_threshold_is_an_error_that_says_to_regenerate() -> None:
    with pytest.raises(RuntimeError, match=r"_config.thresholds changed \(stall\).*mixin/build.py"):
        evaluate("{ thresholds+: { stall: '1h' } }")


def test_a_site_mixin_is_that_site_rules_and_dashboards(tmp_path: Path) -> None:
    site = [
        "--set",
        "stall=30m",
        "--set",
        "target_labels=cluster, namespace, region, job, instance",
    ]
    assert build.main([*site, "-o", str(tmp_path / "mixin")]) == 0
    assert rules_build.main([*site, "-o", str(tmp_path / "rules.yml")]) == 0
    got = evaluate(mixin=tmp_path / "mixin")
    rules = yaml.safe_load((tmp_path / "rules.yml").read_text(encoding="utf-8"))
    by_name = {g["name"]: g for g in got["alerts"]["groups"] + got["rules"]["groups"]}
    assert [by_name[g["name"]] for g in rules["groups"]] == rules["groups"]
    assert got["config"]["thresholds"]["stall"] == "30m"
    runs = got["dashboards"]["trainguard-runs.json"]
    assert "region" in json.dumps(runs) and runs != DASHBOARDS["trainguard-runs.json"]
