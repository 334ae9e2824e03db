"""Checks of alerts/: promtool syntax and unit tests, generator staleness, annotations, runbook."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
ALERTS = ROOT / "alerts"
RULES = ALERTS / "trainguard.rules.yml"
RUNBOOK = ALERTS / "runbook.md"
TEST_FILES = sorted((ALERTS / "tests").glob("*.yml"))

# The alert set of the design (docs: /alerts/runbook.md is the project's own description).
DESIGN_ALERTS = {
    "TrainingProcessDied",
    "TrainingStalled",
    "TrainingLogStale",
    "CheckpointStale",
    "CheckpointTruncated",
    "CheckpointHashMismatch",
    "CheckpointPartialOrphaned",
    "CheckpointVolumeFillingUp",
    "GPUGhostMemory",
    "GPUUnattributedMemory",
    "DuplicateHostProcess",
    "AllocatorRetrying",
    "AllocatorOOM",
    "TrainguardCollectorFailing",
    "TrainguardExporterDown",
    "StepsAtRisk",
    "RepeatedDeathNearSameStep",
}
RUNBOOK_BASE = "https://github.com/trainguard/trainguard/blob/main/alerts/runbook.md"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not installed (Debian/Ubuntu: apt-get install prometheus); CI installs it",
)


def load_build() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trainguard_alerts_build", ALERTS / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def build() -> ModuleType:
    return load_build()


@pytest.fixture(scope="module")
def groups() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return list(doc["groups"])


def alert_rules(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )


# ------------------------------------------------------------------------------- promtool


@needs_promtool
def test_promtool_check_rules() -> None:
    result = promtool("check", "rules", str(RULES.relative_to(ROOT)))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_unit_tests() -> None:
    assert TEST_FILES, "no promtool test files in alerts/tests"
    result = promtool("test", "rules", *(str(p.relative_to(ROOT)) for p in TEST_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


# ------------------------------------------------------------------------------- generator


def test_committed_rules_match_generator(build: ModuleType) -> None:
    assert RULES.read_text(encoding="utf-8") == build.render(), (
        "alerts/trainguard.rules.yml is stale: run python alerts/build.py"
    )


def test_generated_yaml_round_trips(build: ModuleType, groups: list[dict[str, Any]]) -> None:
    # The folded YAML style must not change a single character of exprs and templates.
    expected = build._fill_all(build.rule_groups(), build.resolve())
    assert groups == expected


def test_build_check_mode(tmp_path: Path, build: ModuleType) -> None:
    out = tmp_path / "rules.yml"
    assert build.main(["-o", str(out)]) == 0
    assert build.main(["-o", str(out), "--check"]) == 0
    out.write_text(out.read_text(encoding="utf-8") + "# edited\n", encoding="utf-8")
    assert build.main(["-o", str(out), "--check"]) == 1


def test_overrides_change_only_what_they_name(build: ModuleType) -> None:
    text = build.render({"stall": "1h", "ghost_floor": "4GiB", "job_selector": 'job="gpu"'})
    assert "time() - (trainguard_run_heartbeat_timestamp_seconds > 0) > 3600" in text
    assert "changes(trainguard_run_step[1h])" in text
    assert "> 4294967296" in text
    assert 'up{job="gpu"} == 0' in text
    descriptions = [
        rule["annotations"]["description"]
        for group in yaml.safe_load(text)["groups"]
        for rule in group["rules"]
        if rule.get("alert") == "TrainingStalled"
    ]
    assert descriptions and "(threshold 1h)" in descriptions[0]
    # Untouched thresholds keep their defaults.
    assert "trainguard_checkpoint_oldest_partial_age_seconds > 1800" in text


def test_overrides_from_config_file(tmp_path: Path, build: ModuleType) -> None:
    config = tmp_path / "thresholds.yml"
    config.write_text("stall: 45m\nrepeated_death_steps: 200\n", encoding="utf-8")
    out = tmp_path / "rules.yml"
    assert build.main(["--config", str(config), "-o", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert "changes(trainguard_run_step[45m])" in text
    assert ") <= 200" in text


@pytest.mark.parametrize(
    "overrides",
    [{"no_such_threshold": 1}, {"stall": "soon"}, {"ghost_floor": "lots"}, {"ghost_ratio": 0}],
)
def test_bad_overrides_are_errors(build: ModuleType, overrides: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        build.render(overrides)


def test_bad_override_exit_status(build: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert build.main(["--set", "stall=soon", "-o", "-"]) == 2
    assert "not a duration" in capsys.readouterr().err


# ------------------------------------------------------------------------------- rules


def test_alert_set_matches_design(groups: list[dict[str, Any]]) -> None:
    assert {rule["alert"] for rule in alert_rules(groups)} == DESIGN_ALERTS


def test_every_alert_has_labels_and_annotations(groups: list[dict[str, Any]]) -> None:
    for rule in alert_rules(groups):
        name = rule["alert"]
        assert re.fullmatch(r"[A-Z][A-Za-z0-9]+", name), f"{name}: not CamelCase"
        assert rule["labels"].get("severity") in {"critical", "warning"}, name
        annotations = rule["annotations"]
        for key in ("summary", "description", "runbook_url"):
            assert annotations.get(key, "").strip(), f"{name}: missing {key}"
        assert annotations["runbook_url"] == f"{RUNBOOK_BASE}#{name.lower()}"


def test_pages_are_critical(groups: list[dict[str, Any]]) -> None:
    severities: dict[str, set[str]] = {}
    for rule in alert_rules(groups):
        severities.setdefault(rule["alert"], set()).add(rule["labels"]["severity"])
    for name in (
        "TrainingProcessDied",
        "CheckpointTruncated",
        "CheckpointHashMismatch",
        "AllocatorOOM",
    ):
        assert severities[name] == {"critical"}, name
    # Critical only while it was watching active runs, warning otherwise.
    assert severities["TrainguardExporterDown"] == {"critical", "warning"}


def test_death_pages_without_delay(groups: list[dict[str, Any]]) -> None:
    (died,) = [r for r in alert_rules(groups) if r["alert"] == "TrainingProcessDied"]
    assert died.get("for", "0m") in {"0m", "0s"}


def test_recording_rule_names(groups: list[dict[str, Any]]) -> None:
    records = [rule["record"] for group in groups for rule in group["rules"] if "record" in rule]
    assert records, "no recording rules"
    for name in records:
        assert re.fullmatch(r"[a-z_]+:[a-z_]+:[a-z0-9_]+", name), f"{name}: not level:metric:ops"
    assert "run:trainguard_run_steps_since_checkpoint:max" in records


# ------------------------------------------------------------------------------- runbook


def runbook_headings() -> set[str]:
    text = RUNBOOK.read_text(encoding="utf-8")
    return {m.group(1).strip() for m in re.finditer(r"^##\s+(.+)$", text, re.MULTILINE)}


def test_every_alert_has_a_runbook_section() -> None:
    missing = DESIGN_ALERTS - runbook_headings()
    assert not missing, f"runbook.md lacks sections: {sorted(missing)}"


def test_runbook_internal_links_resolve() -> None:
    anchors = {h.lower() for h in runbook_headings()}
    text = RUNBOOK.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(#([^)]+)\)", text):
        assert target in anchors, f"runbook.md links to missing #{target}"


# ------------------------------------------------------------------------------- unit tests


def unit_test_cases() -> list[tuple[Path, dict[str, Any]]]:
    cases = []
    for path in TEST_FILES:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        for test in doc.get("tests", []):
            for case in test.get("alert_rule_test", []) or []:
                cases.append((path, case))
    return cases


def test_every_alert_has_firing_and_quiet_cases() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for _, case in unit_test_cases():
        (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    assert not DESIGN_ALERTS - firing, f"no firing case: {sorted(DESIGN_ALERTS - firing)}"
    assert not DESIGN_ALERTS - quiet, f"no non-firing case: {sorted(DESIGN_ALERTS - quiet)}"


def test_firing_cases_pin_labels(groups: list[dict[str, Any]]) -> None:
    for path, case in unit_test_cases():
        for alert in case.get("exp_alerts") or []:
            labels = alert.get("exp_labels") or {}
            assert labels.get("severity"), f"{path.name}: {case['alertname']} without severity"


def test_unit_test_files_evaluate_recording_rules_first(groups: list[dict[str, Any]]) -> None:
    names = [group["name"] for group in groups]
    for path in TEST_FILES:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert doc["rule_files"] == ["../trainguard.rules.yml"], path.name
        assert doc.get("group_eval_order") == names, (
            f"{path.name}: group_eval_order must list all groups in file order, "
            "recording rules first"
        )


def test_readme_documents_every_threshold(build: ModuleType) -> None:
    readme = (ALERTS / "README.md").read_text(encoding="utf-8")
    missing = [key for key in build.DEFAULTS if f"`{key}`" not in readme]
    assert not missing, f"alerts/README.md does not mention: {missing}"
