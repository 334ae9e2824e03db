"""Checks of alerts/: promtool syntax and unit tests, generator staleness, annotations, runbook."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts import build, kinds, site
from alerts.rules import GROUPS, Alert
from alerts.rules.common import COMMON_SNIPPETS, PLACEHOLDER
from helpers import promtool_rules
from helpers.exporter_proc import Exporter
from helpers.paths import REPO

ROOT = REPO
ALERTS = ROOT / "alerts"
RULES = ALERTS / "trainguard.rules.yml"
RUNBOOK = ALERTS / "runbook.md"
TEST_FILES = sorted((ALERTS / "tests").glob("*.yml"))

#: every alert the rule modules define; the runbook has a section of each name, and only those
#: (test_rule_names_match_runbook_headings)
ALERT_NAMES = {rule.name for group in GROUPS for rule in group.rules if isinstance(rule, Alert)}
# Alerts that always fire (a dead man's switch): severity none, no quiet case.
ALWAYS_FIRING = {"Watchdog"}
# The runbook the exporter ships and serves at /runbook, on the alert's own exporter. It was a
# GitHub address of a repository that does not exist (404): a default must work out of the box.
RUNBOOK_BASE = 'http://{{ or $labels.instance "localhost:9636" }}/runbook'
#: the alerts whose expression judges a job across its nodes (``${target_labels_across}``,
#: directly or through a snippet): filled with a marker in its place
ACROSS_ALERTS = {
    rule["alert"]
    for group in build.rule_groups({**site.resolve(), "target_labels_across": "ACROSS_MARK"})
    for rule in group["rules"]
    if "alert" in rule and "ACROSS_MARK" in rule["expr"]
}
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not installed (Debian/Ubuntu: apt-get install prometheus); CI installs it",
)


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
    # promtool exits 0 on a lint finding (two rules of one name and the same labels) but
    # prints FAILED: a newcomer's first check must not look broken
    output = result.stdout + result.stderr
    assert "FAILED" not in output and "lint" not in output, output
    assert "SUCCESS" in output, output


@pytest.mark.slow(seconds=100)  # on 2 cores, with its own pool of a promtool per CPU
@needs_promtool
def test_promtool_unit_tests() -> None:
    """Every file of alerts/tests, one promtool per file, each with the rule groups it needs
    (tests/helpers/promtool_rules.py), as many at a time as there are CPUs."""
    assert TEST_FILES, "no promtool test files in alerts/tests"
    assert PROMTOOL is not None
    results = promtool_rules.run(TEST_FILES, PROMTOOL)
    failed = {p.name: r.stdout + r.stderr for p, r in results.items() if r.returncode}
    assert failed == {}, "\n".join(f"--- {f}\n{out}" for f, out in failed.items())
    assert all("SUCCESS" in r.stdout for r in results.values())


# ------------------------------------------------------------------------------- generator


def test_committed_rules_match_generator() -> None:
    assert RULES.read_text(encoding="utf-8") == build.render(), (
        "alerts/trainguard.rules.yml is stale: run python alerts/build.py"
    )


def test_generated_yaml_round_trips(groups: list[dict[str, Any]]) -> None:
    # The folded YAML style must not change a single character of exprs and templates.
    assert groups == build.rule_groups()


def test_build_check_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rules.yml"
    assert build.main(["-o", str(out)]) == 0
    assert build.main(["-o", str(out), "--check"]) == 0
    out.write_text(out.read_text(encoding="utf-8") + "# edited\n", encoding="utf-8")
    capsys.readouterr()
    assert build.main(["-o", str(out), "--check"]) == 1
    assert f"is stale: run python alerts/build.py -o {out}" in capsys.readouterr().err
    out.unlink()
    assert build.main(["-o", str(out), "--check"]) == 1
    assert not out.exists(), "--check must not write"


def test_check_compares_with_the_given_overrides(tmp_path: Path) -> None:
    out = tmp_path / "rules.yml"
    assert build.main(["--set", "stall=1h", "-o", str(out)]) == 0
    assert build.main(["--set", "stall=1h", "-o", str(out), "--check"]) == 0
    assert build.main(["-o", str(out), "--check"]) == 1


def test_output_dash_writes_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert build.main(["-o", "-"]) == 0
    assert capsys.readouterr().out == RULES.read_text(encoding="utf-8")
    assert build.main(["-o", "-", "--check"]) == 2


def test_script_runs_from_any_directory(tmp_path: Path) -> None:
    script = [sys.executable, str(ALERTS / "build.py")]
    run = subprocess.run(
        [*script, "-o", "-"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == RULES.read_text(encoding="utf-8")
    check = subprocess.run([*script, "--check"], cwd=tmp_path, capture_output=True, check=False)
    assert check.returncode == 0, check.stderr


def test_overrides_change_only_what_they_name() -> None:
    text = build.render({"stall": "1h", "ghost_floor": "4GiB", "job_selector": 'job="gpu"'})
    assert "trainguard_run_heartbeat_age_seconds > 3600" in text
    assert re.search(r"run_rank:trainguard_run_step_gap_seconds:max\[4h\]\),\s+3600,", text)
    assert "> 4294967296" in text
    assert 'up{job="gpu"} == 0' in text
    descriptions = [
        rule["annotations"]["description"]
        for group in yaml.safe_load(text)["groups"]
        for rule in group["rules"]
        if rule.get("alert") == "TrainingStalled"
    ]
    assert descriptions and "at least 1h and at most 4h" in descriptions[0]
    # Untouched thresholds keep their defaults.
    assert "trainguard_checkpoint_oldest_partial_age_seconds > 1800" in text


def test_pace_group_is_never_evaluated_less_often_than_the_slow_group() -> None:
    # the slow group reads the pace group's records: a site (or a test) that runs the slow
    # group every 30s gets the pace group every 30s too, not every minute
    def interval(text: str) -> str:
        group = next(g for g in yaml.safe_load(text)["groups"] if g["name"].endswith(".pace"))
        return str(group["interval"])

    assert interval(build.render({})) == "1m"
    assert interval(build.render({"slow_rules_interval": "30s"})) == "30s"
    assert interval(build.render({"pace_rules_interval": "2m"})) == "2m"
    with pytest.raises(site.ThresholdError, match=r"stall_gap_lookback .* pace_rules"):
        build.render({"pace_rules_interval": "3m"})  # 5m lookback: would miss intervals


def test_target_labels_are_kept_by_every_aggregation_and_join() -> None:
    # alerts/tests/labels_test.yml: the defaults keep cluster and namespace; a site adds its own
    text = build.render({"target_labels": ["region", "job", "instance"]})
    assert "count by (region, job, instance, run)" in text
    assert "on (region, job, instance, run, rank)" in text
    assert "region=%q,job=%q,instance=%q,run=%q" in text
    assert "$labels.region $labels.job $labels.instance $labels.run" in text
    # nothing aggregates or joins by a list that leaves the target labels out, but the job
    # rules (alerts/rules/jobs/, stuck.py), which judge a job across its nodes: all of them
    # but instance (then the run follows)
    assert "count by (region, job, run, job_id)" in text
    assert "on (region, job, run, location)" in text  # a restore drill's result, any exporter
    assert "bottomk by (region, job, run, location)" in text  # the newest drill result
    assert "quantile by (region, job, run, job_id)" in text  # jobs/slow.py: within a job
    flat = " ".join(text.split())  # an annotation's query may be folded over two lines
    kept = r"\b(?:by|on) \((?!region, job, instance)(?!region, job, run\b)[^)]*\)"
    assert not re.search(kept, flat), re.findall(kept, flat)


def test_overrides_from_config_file(tmp_path: Path) -> None:
    config = tmp_path / "thresholds.yml"
    config.write_text("stall: 45m\nrepeated_death_steps: 200\nlog_stale: 3600\n", encoding="utf-8")
    out = tmp_path / "rules.yml"
    assert build.main(["--config", str(config), "-o", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert "trainguard_run_heartbeat_age_seconds > 2700" in text
    assert ") <= 200" in text
    assert "max_over_time(trainguard_run_log_modified_timestamp_seconds[1h])" in text  # seconds
    # --set wins over --config.
    assert build.main(["--config", str(config), "--set", "stall=2h", "-o", str(out)]) == 0
    assert "trainguard_run_heartbeat_age_seconds > 7200" in out.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "overrides",
    [
        {"no_such_threshold": 1},
        {"stall": "soon"},
        {"stall": True},
        {"ghost_floor": "lots"},
        {"ghost_ratio": 0},
        {"job_selector": ""},
        {"runbook_base": "https://example.com/runbook.md#x"},
        {"xid_critical": "79,0"},
        {"xid_warning": [13, True]},
        {"target_labels": "cluster, job"},
        {"target_labels": "job, instance, run"},
        {"target_labels": "job, instance, job"},
    ],
)
def test_bad_overrides_are_errors(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        build.render(overrides)


# One or more bad values of each kind: exit 2, and the message names the threshold and its kind.
BAD_VALUES = [
    ("stall", "soon", "duration"),
    ("checkpoint_stale", "0", "duration"),
    ("ghost_ratio", "lots", "number"),
    ("repeated_death_steps", "-5", "number"),
    ("ghost_floor", "2 gigs", "bytes"),
    ("job_selector", "job=trainguard", "selector"),
    ("runbook_base", "runbook.md", "url"),
    ("xid_critical", "79,fatal", "xid codes"),
    ("xid_warning", "", "xid codes"),
    ("target_labels", "job,,instance", "labels"),
]


@pytest.mark.parametrize(("name", "value", "kind"), BAD_VALUES)
def test_bad_set_value_exit_status(
    name: str, value: str, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert build.main(["--set", f"{name}={value}", "-o", "-"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"threshold {name} ({kind})" in captured.err
    assert len(captured.err.strip().splitlines()) == 1


def test_bad_value_cases_cover_every_kind() -> None:
    assert {kind for _, _, kind in BAD_VALUES} == {kind.name for kind in kinds.KINDS}


def test_bad_config_files_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert build.main(["--config", str(tmp_path / "missing.yml"), "-o", "-"]) == 2
    not_a_mapping = tmp_path / "list.yml"
    not_a_mapping.write_text("- stall\n", encoding="utf-8")
    assert build.main(["--config", str(not_a_mapping), "-o", "-"]) == 2
    broken = tmp_path / "broken.yml"
    broken.write_text("stall: [\n", encoding="utf-8")
    assert build.main(["--config", str(broken), "-o", "-"]) == 2
    assert build.main(["--set", "stall", "-o", "-"]) == 2
    assert capsys.readouterr().out == ""


def test_config_file_is_read_like_the_exporters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--config goes through the exporter's YAML loader: a key given twice is refused with
    its line, not silently overridden by the second."""
    config = tmp_path / "thresholds.yml"
    config.write_text("stall: 1h\nghost_ratio: 2\nstall: 2h\n", encoding="utf-8")
    assert build.main(["--config", str(config), "-o", "-"]) == 2
    assert f"{config}:3:1: invalid YAML: duplicate key 'stall'" in capsys.readouterr().err


def test_list_prints_every_threshold_as_a_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert build.main(["--list", "--set", "stall=1h"]) == 0
    text = capsys.readouterr().out
    listed = yaml.safe_load(text)
    assert list(listed) == [t.name for t in site.THRESHOLDS]
    assert listed["stall"] == "1h" and listed["ghost_floor"] == "2GiB"
    for t in site.THRESHOLDS:
        assert t.doc.split()[0] in text, t.name
    # The listing is a valid --config: feeding it back gives the same rules.
    config = tmp_path / "listed.yml"
    config.write_text(text, encoding="utf-8")
    assert build.render(site.load_config(config)) == build.render({"stall": "1h"})


def test_every_placeholder_is_known_and_every_threshold_used() -> None:
    texts = ["${runbook_base}", *COMMON_SNIPPETS.values()]  # runbook_url: by the renderer
    snippets: set[str] = set(COMMON_SNIPPETS)
    for group in GROUPS:
        snippets |= set(group.snippets)
        texts.append(group.interval or "")
        texts += group.snippets.values()
        for rule in group.rules:
            texts.append(rule.expr)
            if isinstance(rule, Alert):
                texts += [rule.for_ or "", rule.keep_firing_for or ""]
                texts += [rule.summary, rule.description, *rule.annotations.values()]
    used = {name for text in texts for name in PLACEHOLDER.findall(text)}
    placeholders = set(site.resolve())
    assert not snippets & placeholders, "snippet names shadow thresholds"
    assert used <= placeholders | snippets, f"unknown: {sorted(used - placeholders - snippets)}"
    unused = [t.name for t in site.THRESHOLDS if not used & {t.name, f"{t.name}_s", f"{t.name}_h"}]
    assert not unused, f"thresholds no rule uses: {unused}"


def test_rule_modules_use_one_template_syntax() -> None:
    # Go templates and PromQL are written literally: no f-string escaping, no [[x]] placeholders,
    # no WORD put in by str.replace (unchecked: a misspelt WORD stays valid PromQL, and the
    # alert silently never fires); a PromQL fragment is a ${name} snippet of its group.
    paths = sorted((ALERTS / "rules").rglob("*.py"))
    assert len(paths) > 20, paths
    for path in paths:
        source = path.read_text(encoding="utf-8")
        for old in ("{{{{", "}}}}", "[["):
            assert old not in source, f"{path.name}: {old}"
        assert not re.search(r"(?<!\w)f[\"']", source), f"{path.name}: f-string"
        assert not re.search(r"\.replace\(\s*[\"'][A-Z_)]+[\"']", source), f"{path.name}: .replace"


@pytest.mark.parametrize("where", ["expr", "description", "snippet"])
def test_an_unknown_placeholder_fails_the_build(
    where: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A misspelt ${name} is an error naming the group, the rule and the name, not PromQL
    that never matches."""
    index, group = next((i, g) for i, g in enumerate(GROUPS) if g.name == "trainguard-runs")
    died = group.rules[0]
    assert isinstance(died, Alert) and died.name == "TrainingProcessDied"
    assert "${dead_when_last_seen}" in died.expr and "${run_host}" in died.description
    if where == "expr":
        rules = (
            replace(died, expr=died.expr.replace("${dead_when_last_seen}", "${dead_when_seen}")),
        )
        bad = replace(group, rules=rules + group.rules[1:])
        expected = (
            "group trainguard-runs, rule TrainingProcessDied: unknown placeholder ${dead_when_seen}"
        )
    elif where == "description":
        rules = (replace(died, description=died.description + " ${run_hots}"),)
        bad = replace(group, rules=rules + group.rules[1:])
        expected = (
            "group trainguard-runs, rule TrainingProcessDied: unknown placeholder ${run_hots}"
        )
    else:
        snippets = {**group.snippets, "live": "${stat} == 1"}
        bad = replace(group, snippets=snippets)
        expected = "group trainguard-runs: snippet ${live}: unknown placeholder ${stat}"
    monkeypatch.setattr(build, "GROUPS", (*GROUPS[:index], bad, *GROUPS[index + 1 :]))
    assert build.main(["-o", "-"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == f"alerts/build.py: error: {expected}"


# ------------------------------------------------------------------------------- rules


def test_rule_names_match_runbook_headings(groups: list[dict[str, Any]]) -> None:
    """Each alert has its runbook section (its runbook_url's anchor), and each section its
    alert: a renamed or removed alert leaves no orphan behind."""
    assert {rule["alert"] for rule in alert_rules(groups)} == ALERT_NAMES
    headings = runbook_headings()
    assert not ALERT_NAMES - headings, (
        f"runbook.md lacks sections: {sorted(ALERT_NAMES - headings)}"
    )
    assert not headings - ALERT_NAMES, (
        f"runbook.md sections of no alert: {sorted(headings - ALERT_NAMES)}"
    )


def test_every_alert_has_labels_and_annotations(groups: list[dict[str, Any]]) -> None:
    for rule in alert_rules(groups):
        name = rule["alert"]
        assert re.fullmatch(r"[A-Z][A-Za-z0-9]+", name), f"{name}: not CamelCase"
        severities = {"none"} if name in ALWAYS_FIRING else {"critical", "warning"}
        assert rule["labels"].get("severity") in severities, name
        annotations = rule["annotations"]
        for key in ("summary", "description", "runbook_url"):
            assert annotations.get(key, "").strip(), f"{name}: missing {key}"
        url = annotations["runbook_url"]
        if name in ACROSS_ALERTS:  # a job's: no instance label
            # $labels.instance stands for the exporter of the job's lowest rank (runbook_url.py)
            prelude, _, url = url.partition("{{ end }}{{ end }}{{ end }}")
            assert prelude.startswith("{{ $instance := $labels.instance }}"), prelude
            url = url.replace("$instance", "$labels.instance")
        assert url == f"{RUNBOOK_BASE}#{name.lower()}", annotations["runbook_url"]


def test_pages_are_critical(groups: list[dict[str, Any]]) -> None:
    severities: dict[str, set[str]] = {}
    for rule in alert_rules(groups):
        severities.setdefault(rule["alert"], set()).add(rule["labels"]["severity"])
    for name in ("TrainingProcessDied", "AllocatorOOM"):
        assert severities[name] == {"critical"}, name
    # Severity follows the damage: a warning while an intact copy of the damaged step (or a newer
    # one) remains within the cadence, a page when none does (checkpoints_test.yml).
    for name in ("CheckpointTruncated", "CheckpointHashMismatch"):
        assert severities[name] == {"critical", "warning"}, name
    # Critical only while it was watching active runs, warning otherwise.
    assert severities["TrainguardExporterDown"] == {"critical", "warning"}


def test_death_pages_without_delay_and_holds_through_gaps(groups: list[dict[str, Any]]) -> None:
    (died,) = [r for r in alert_rules(groups) if r["alert"] == "TrainingProcessDied"]
    assert died.get("for", "0m") in {"0m", "0s"}
    # a missed scrape must not resolve the page and send a second one (runs_test.yml)
    assert died["keep_firing_for"] == "10m"


LONG_RANGE = re.compile(r"(changes|max_over_time|min_over_time)\([^()]*\[(\d+)([dw])\]")


def test_long_range_recording_rules_are_in_the_slow_group(groups: list[dict[str, Any]]) -> None:
    # Mixin style: [7d] range queries cost too much to evaluate every 15 s; the slow group's
    # interval is slow_rules_interval, and its readers look back over several of its intervals
    # (checkpoints_test.yml: the cadence holds between the slow group's evaluations).
    slow = [g for g in groups if g["name"].endswith(".slow")]
    # the pace group (1m): minutes-scale records; instant reads of them (lookback 5m) see them;
    # the window groups (1m): alerts judged over minutes, and the records only they read
    pace = [g for g in groups if "interval" in g and g not in slow]
    assert [(g["name"], g["interval"]) for g in pace] == [
        ("trainguard.rules.pace", "1m"),
        ("trainguard-checkpoints.window", "1m"),
        ("trainguard-gpu.window", "1m"),
        ("trainguard-allocator.window", "1m"),
        ("trainguard-gpu-health.window", "1m"),
    ]
    assert [g["name"] for g in slow] == [
        "trainguard.rules.slow",
        "trainguard-checkpoints.slow",
        "trainguard-allocator.slow",
        "trainguard-training-health.slow",
        "trainguard-goodput.slow",
    ]
    assert all(g["interval"] == "5m" for g in slow)
    assert all("record" in rule for g in slow for rule in g["rules"]), (
        "alerts belong to fast groups"
    )
    for group in groups:
        for rule in group["rules"]:
            if "record" in rule and LONG_RANGE.search(rule["expr"]):
                assert group in slow, f"{rule['record']}: a [days] range in a fast group"
    records = {rule["record"] for g in slow for rule in g["rules"]}
    assert "run:trainguard_checkpoint_step_cadence:avg" in records
    # every reader of a slow series outside the slow groups (evaluated in order, they read
    # their own series of the same evaluation) tolerates the gaps between their evaluations
    text = RULES.read_text(encoding="utf-8")
    outside = yaml.safe_dump({"groups": [g for g in groups if g not in slow]}, width=10**6)
    for record in records:
        for use in re.finditer(re.escape(record) + r"(\{[^}]*\})?(\[\w+\])?", outside):
            # over three intervals at least (stall_max, 4h, for the step gap)
            assert use.group(2) in ("[15m]", "[4h]"), f"{record} read without last_over_time[15m]"
    assert "last_over_time(job:trainguard_run_goodput:ratio_24h[15m])" in text


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


def test_every_runbook_url_resolves_on_the_exporter(tmp_path: Path) -> None:
    # runbook_url is http://<the alert's exporter>/runbook#<alert>: the exporter serves the
    # runbook it ships, with the anchor of every alert (test_e2e_alerts.py follows a delivered
    # alert's link)
    with Exporter(state_dir=tmp_path) as exp:
        page = exp.get("/runbook")
        assert 'href="/runbook"' in exp.get("/")
    ids = set(re.findall(r'<h2 id="([^"]+)">', page))
    assert {name.lower() for name in ALERT_NAMES} <= ids
    # links between sections stay links, code stays code
    assert '<a href="#checkpointvolumefillingup">CheckpointVolumeFillingUp</a>' in page
    assert "<pre><code>" in page and "<script" not in page


def test_runbook_base_is_a_setting(tmp_path: Path) -> None:
    text = build.render({"runbook_base": "https://wiki.example.com/ml/trainguard"})
    assert "runbook_url: https://wiki.example.com/ml/trainguard#trainingprocessdied" in text
    templated = build.render({"runbook_base": "https://{{ $labels.instance }}/runbook"})
    assert "https://{{ $labels.instance }}/runbook#stepsatrisk" in templated
    with pytest.raises(ValueError):
        build.render({"runbook_base": "http://{{ $labels.instance }}/runbook#top"})


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
    assert not ALERT_NAMES - firing, f"no firing case: {sorted(ALERT_NAMES - firing)}"
    quiet_needed = ALERT_NAMES - ALWAYS_FIRING
    assert not quiet_needed - quiet, f"no non-firing case: {sorted(quiet_needed - quiet)}"
    assert not quiet & ALWAYS_FIRING, "an always-firing alert with a quiet case"


#: series the rules read that a healthy run does not have: they appear with a death or damage
ABSENT_WHILE_HEALTHY = {
    "trainguard_run_last_death_age_seconds",
    "trainguard_run_last_death_info",
    "trainguard_run_last_death_job_info",
    "trainguard_run_last_death_step",
    "trainguard_run_last_death_timestamp_seconds",
    "trainguard_run_exit_info",
    "trainguard_checkpoint_newest_damaged_step",
    "trainguard_run_stuck_info",  # only while a rank's step is overdue
    "trainguard_checkpoint_last_save_failure_timestamp_seconds",
    "trainguard_checkpoint_last_save_failure_age_seconds",
    "trainguard_run_loss_nonfinite_first_step",  # only while the loss is not finite
    "trainguard_heartbeat_file_invalid",  # only for a file that cannot be used
}


def test_healthy_run_for_hours_fires_nothing_but_the_watchdog() -> None:
    # alerts/tests/healthy_test.yml (run by test_promtool_unit_tests): every series the rules
    # read is there with healthy values for six hours, and every alert is checked quiet
    doc = yaml.safe_load((ALERTS / "tests" / "healthy_test.yml").read_text(encoding="utf-8"))
    (test,) = doc["tests"]
    given = {s["series"].partition("{")[0] for s in test["input_series"]}
    rules = RULES.read_text(encoding="utf-8")
    read = set(re.findall(r"(?<![:\w])trainguard_[a-z_]+(?![:\w])", rules)) | {"up"}
    assert not read - given - ABSENT_WHILE_HEALTHY, sorted(read - given - ABSENT_WHILE_HEALTHY)
    assert not ABSENT_WHILE_HEALTHY & given
    quiet_at_end = {
        case["alertname"]
        for case in test["alert_rule_test"]
        if case["eval_time"] == "6h" and case["exp_alerts"] == []
    }
    assert quiet_at_end == ALERT_NAMES - ALWAYS_FIRING
    fired = [c["alertname"] for c in test["alert_rule_test"] if c["exp_alerts"]]
    assert fired == ["Watchdog"]


def test_firing_cases_pin_labels(groups: list[dict[str, Any]]) -> None:
    for path, case in unit_test_cases():
        for alert in case.get("exp_alerts") or []:
            labels = alert.get("exp_labels") or {}
            assert labels.get("severity"), f"{path.name}: {case['alertname']} without severity"


def test_unit_test_files_name_only_the_groups_whose_order_matters(
    groups: list[dict[str, Any]], tmp_path: Path
) -> None:
    """The harness supplies the rules file and the order (file order, recording rules first);
    a test file names the groups it needs in another order, if any."""
    names = [group["name"] for group in groups]
    for path in TEST_FILES:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert doc["rule_files"] == ["../trainguard.rules.yml"], path.name
        assert doc.get("group_eval_order", []) != names, (
            f"{path.name}: the file order is the default"
        )
        prepared = yaml.safe_load(promtool_rules.prepare(path, groups, tmp_path).read_text())
        order = prepared["group_eval_order"]
        in_file_order = [name for name in names if name in order]
        declared = doc.get("group_eval_order") or []
        if declared:  # its groups in its order (first_evaluation_test.yml: alerts first)
            assert sorted(order) == sorted(in_file_order), path.name
            assert [name for name in order if name in declared] == declared, path.name
        else:
            assert order == in_file_order, path.name
        given = yaml.safe_load(Path(prepared["rule_files"][0]).read_text())["groups"]
        assert [g["name"] for g in given] == in_file_order and given == [
            g for g in groups if g["name"] in order
        ]


def test_each_promtool_file_gets_the_groups_its_alerts_read(groups: list[dict[str, Any]]) -> None:
    """The groups of the alerts a file tests, and of every record they read, transitively
    (expressions and annotation queries): a group left out would leave an alert without its
    records, and its case would fail for the wrong reason or pass for one."""

    def needs(*alerts: str) -> list[str]:
        cases = [{"alertname": name} for name in alerts]
        return promtool_rules.needed_groups(groups, {"tests": [{"alert_rule_test": cases}]})

    # its own group, the slow records it reads (last_over_time of checkpoint history), the 15 s
    # records those read, and the GPU records the gpu_cause of the run context reads
    stale = needs("CheckpointStale")
    assert {
        "trainguard-checkpoints.window",
        "trainguard-checkpoints.slow",
        "trainguard.rules",
    } <= set(stale)
    assert "trainguard-allocator" not in stale and "trainguard-jobs-slow" not in stale
    assert needs("TrainingRankSlow") == ["trainguard-jobs-slow"]
    assert "trainguard-exporter" in needs("Watchdog")  # its group, with its readers' records
    every = needs(*(r["alert"] for g in groups for r in g["rules"] if "alert" in r))
    assert every == [g["name"] for g in groups]  # every group is read or alerts
    # a record asked for in promql_expr_test brings its group, and an unknown alert is an error
    expr = {"tests": [{"promql_expr_test": [{"expr": "run:trainguard_run_step:max"}]}]}
    asked = promtool_rules.needed_groups(groups, expr)
    assert asked[0] == "trainguard.rules" and "trainguard-checkpoints" not in asked
    alerts = 'ALERTS{alertname="TrainingRankSlow",alertstate="firing"}'
    assert promtool_rules.needed_groups(
        groups, {"tests": [{"promql_expr_test": [{"expr": alerts}]}]}
    ) == ["trainguard-jobs-slow"]
    with pytest.raises(ValueError, match="TrainingProcesDied"):
        needs("TrainingProcesDied")
    # a group named in group_eval_order is given, in that order among the others
    assert promtool_rules.eval_order(["a", "b", "c", "d"], ["d", "b"]) == ["a", "d", "c", "b"]


def test_readme_threshold_table_is_generated() -> None:
    """The table of thresholds in alerts/README.md is the thresholds' own docs, regenerated by
    alerts/build.py (and compared by --check): one row per threshold, none written twice."""
    text = (ALERTS / "README.md").read_text(encoding="utf-8")
    assert text == build.readme(text), "alerts/README.md is stale: run python alerts/build.py"
    table = text[text.index(build.TABLE_START) : text.index(build.TABLE_END)]
    rows = re.findall(r"^\| `(\w+)` \| `([^`]*)` \|", table, re.MULTILINE)
    assert rows == [(t.name, site.shown(site.resolve())[t.name]) for t in site.THRESHOLDS]
    edited = text.replace("| `stall` | `10m` |", "| `stall` | `20m` |")
    assert edited != text and build.readme(edited) == text
