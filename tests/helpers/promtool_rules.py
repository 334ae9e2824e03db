"""Run the promtool test files of alerts/tests, each against only the rule groups it needs.

promtool evaluates every group of its rule files at every step of every test, so a file that
tests one alert paid for all the groups of ``alerts/trainguard.rules.yml``. Here a test file gets
the groups of the alerts and records it tests (``alert_rule_test``'s alertname, the records and
the alerts' ``ALERTS`` series named in ``promql_expr_test``), plus, transitively, the groups of
every recording rule those groups read (in an expression, a label or an annotation's query),
found in the rules themselves. A recorded series is the only way one group's rules see
another's (no rule reads ``ALERTS``), so every case sees what it would with the whole file.

A test file names the rules file as ``rule_files: [../trainguard.rules.yml]`` and, in
``group_eval_order``, only the groups whose order matters beyond the file's (none today); the
harness evaluates the rest in file order, recording rules first, as ``GROUPS`` orders them.

    python tests/helpers/promtool_rules.py alerts/tests/*.yml   # what test_alerts.py runs
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "alerts" / "trainguard.rules.yml"
#: how a test file names the rules file (relative to alerts/tests/)
RULE_FILES = ["../trainguard.rules.yml"]

_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def _names(value: object) -> set[str]:
    """Every metric-name-like token in a rule or a test's value, however nested."""
    if isinstance(value, str):
        return set(_NAME.findall(value))
    if isinstance(value, Mapping):
        return {name for item in value.values() for name in _names(item)}
    if isinstance(value, list):
        return {name for item in value for name in _names(item)}
    return set()


def needed_groups(groups: Sequence[Mapping[str, Any]], test_file: Mapping[str, Any]) -> list[str]:
    """The names of the groups ``test_file`` needs, in file order, its ordered groups included."""
    recorded_by = {
        rule["record"]: group["name"]
        for group in groups
        for rule in group["rules"]
        if "record" in rule
    }
    alerted_by: dict[str, set[str]] = {}
    for group in groups:
        for rule in group["rules"]:
            if "alert" in rule:
                alerted_by.setdefault(rule["alert"], set()).add(group["name"])
    reads = {
        group["name"]: {recorded_by[name] for name in _names(group["rules"]) if name in recorded_by}
        for group in groups
    }
    wanted: set[str] = set(test_file.get("group_eval_order") or [])
    for test in test_file.get("tests") or []:
        for case in test.get("alert_rule_test") or []:
            if case["alertname"] not in alerted_by:
                raise ValueError(
                    f"alert_rule_test of an alert no rule defines: {case['alertname']}"
                )
            wanted |= alerted_by[case["alertname"]]
        for case in test.get("promql_expr_test") or []:
            # a record, or an alert's ALERTS{alertname="..."} series
            for name in _names(case["expr"]):
                wanted |= (
                    {recorded_by[name]} if name in recorded_by else alerted_by.get(name, set())
                )
    todo = list(wanted)
    while todo:
        for name in reads[todo.pop()] - wanted:
            wanted.add(name)
            todo.append(name)
    return [group["name"] for group in groups if group["name"] in wanted]


def eval_order(needed: Sequence[str], ordered: Sequence[str]) -> list[str]:
    """``needed`` in file order, where the groups ``ordered`` names take its order among them."""
    listed = iter(ordered)
    return [next(listed) if name in ordered else name for name in needed]


def prepare(path: Path, groups: Sequence[Mapping[str, Any]], into: Path) -> Path:
    """Write ``path``'s test file, and a rules file of the groups it needs, into ``into``."""
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    if doc.get("rule_files") != RULE_FILES:
        raise ValueError(f"{path.name}: rule_files must be {RULE_FILES}")
    ordered = list(doc.get("group_eval_order") or [])
    unknown = set(ordered) - {group["name"] for group in groups}
    if unknown:
        raise ValueError(f"{path.name}: group_eval_order names no such group: {sorted(unknown)}")
    needed = needed_groups(groups, doc)
    rules = into / (path.stem + ".rules.yml")
    rules.write_text(
        yaml.safe_dump({"groups": [g for g in groups if g["name"] in needed]}, sort_keys=False),
        encoding="utf-8",
    )
    doc["rule_files"] = [str(rules)]
    doc["group_eval_order"] = eval_order(needed, ordered)
    test = into / path.name
    test.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return test


def run(
    paths: Iterable[Path], promtool: str = "promtool", rules: Path = RULES
) -> dict[Path, subprocess.CompletedProcess[str]]:
    """``promtool test rules`` on each test file, as many at a time as there are CPUs.

    promtool works through its files one after the other on a single core.
    """
    groups = yaml.safe_load(rules.read_text(encoding="utf-8"))["groups"]
    paths = list(paths)
    with tempfile.TemporaryDirectory(prefix="promtool-") as tmp:
        prepared = [prepare(path, groups, Path(tmp)) for path in paths]

        def one(test: Path) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [promtool, "test", "rules", str(test)],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )

        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            results = list(pool.map(one, prepared))
    return dict(zip(paths, results, strict=True))


def main(argv: Sequence[str]) -> int:
    """Run the given test files (default: all of alerts/tests); exit 1 if any fails."""
    paths = [Path(a) for a in argv] or sorted((REPO / "alerts" / "tests").glob("*.yml"))
    failed = 0
    for path, result in run(paths).items():
        print(f"{'ok  ' if result.returncode == 0 else 'FAIL'} {path}")
        if result.returncode:
            failed += 1
            print(result.stdout + result.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
