"""Which alerts the shipped rules fire, with their labels and annotations, over promtool series.

``promtool test rules`` checks expectations but never says what fired when it matches. Asking
it to expect no alert at all makes it print, for every alert that did fire, its labels and its
rendered annotations; :func:`firing` reads that back, so a test can assert on what the page
says (the rank and host named, the function) without restating every annotation.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

import yaml

from helpers.paths import REPO

RULES = REPO / "alerts" / "trainguard.rules.yml"
PROMTOOL = shutil.which("promtool")

Alert = tuple[dict[str, str], dict[str, str]]  # labels, annotations

_CASE = re.compile(r"^\s*alertname: (\S+), time: (\S+), *$")
_LABELS = re.compile(r"^\s*(Labels|Annotations):\{(.*)\},?\s*$")
_PAIR = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _pairs(text: str) -> dict[str, str]:
    return {k: json.loads('"' + v + '"') for k, v in _PAIR.findall(text)}


def go_minutes(minutes: int) -> str:
    """A whole number of minutes as promtool writes a duration (``1h3m``, ``2h``, ``33m``)."""
    hours, rest = divmod(minutes, 60)
    return (f"{hours}h" if hours else "") + (f"{rest}m" if rest or not hours else "")


def group_order(rules: Path = RULES) -> list[str]:
    """The rule groups in file order (promtool's ``group_eval_order``)."""
    return [g["name"] for g in yaml.safe_load(rules.read_text())["groups"]]


def firing(
    series: Sequence[dict[str, str]],
    checks: Iterable[tuple[str, int]],
    workdir: Path,
    rules: Path = RULES,
    evaluation_interval: str = "1m",
) -> dict[tuple[str, int], list[Alert]]:
    """For each ``(alertname, minute)``: the alerts of that name firing at that minute.

    promtool evaluates every group at ``evaluation_interval``, whatever the group's own.
    """
    if PROMTOOL is None:
        raise AssertionError("promtool is not on PATH")
    checks = list(checks)
    doc = {
        "rule_files": [str(rules)],
        "evaluation_interval": evaluation_interval,
        "group_eval_order": group_order(rules),
        "tests": [
            {
                "interval": "1m",
                "input_series": list(series),
                "alert_rule_test": [
                    {"eval_time": go_minutes(t), "alertname": name, "exp_alerts": []}
                    for name, t in checks
                ],
            }
        ],
    }
    path = workdir / "firing_test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=10_000))
    proc = subprocess.run(
        [PROMTOOL, "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out: dict[tuple[str, int], list[Alert]] = {check: [] for check in checks}
    by_text = {(name, go_minutes(t)): (name, t) for name, t in checks}
    case: tuple[str, int] | None = None
    in_got = False
    labels: dict[str, str] = {}
    for line in proc.stdout.splitlines() + proc.stderr.splitlines():
        if m := _CASE.match(line):
            case, in_got = by_text.get((m.group(1), m.group(2))), False
        elif line.strip().startswith("got:"):
            in_got = True
        elif case is not None and in_got and (m := _LABELS.match(line)):
            if m.group(1) == "Labels":
                labels = _pairs(m.group(2))
            else:
                out.setdefault(case, []).append((labels, _pairs(m.group(2))))
    failed = sum(len(v) for v in out.values())
    if proc.returncode != 0 and not failed:
        raise AssertionError(f"promtool failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return out
