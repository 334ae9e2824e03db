"""No rule subtracts a host timestamp from Prometheus' time().

A timestamp the exporter publishes (``trainguard_*_timestamp_seconds``) is the training host's
clock (or the drill's, the file server's); ``time()`` is Prometheus'. Their difference is the
skew between the two as much as an age: a host 50 minutes behind paged CheckpointSavesFailing
while saves were fine. Rules judge ages the exporter computes on its own clock
(``*_age_seconds``), timestamps compared with timestamps of the same host, or Prometheus-side
change times (a recording rule of ``time()``, named ``...:time``). This reads every rule's
expression in the generated file and fails on ``time() - <an exporter series>`` or
``<an exporter series> - time()``, however the operand is wrapped.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from helpers.paths import REPO

RULES = REPO / "alerts" / "trainguard.rules.yml"
#: an exporter series: a trainguard_ name with no recording rule's colon
_EXPORTER = re.compile(r"(?<![:\w])trainguard_[a-z0-9_]+(?![:\w])")
_SET_OPS = (" and ", " or ", " unless ")


def _operand_after(text: str, start: int) -> str:
    """The operand that begins at ``start``: a parenthesised group, or a term up to an operator."""
    i = start
    while i < len(text) and text[i].isspace():
        i += 1
    depth = 0
    j = i
    while j < len(text):
        c = text[j]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif depth == 0 and j > i and (c in "+-*/<>=!^%" or text.startswith(_SET_OPS, j)):
            break
        j += 1
    return text[i:j]


def _operand_before(text: str, end: int) -> str:
    """The operand that ends at ``end`` (reading backwards)."""
    j = end
    while j > 0 and text[j - 1].isspace():
        j -= 1
    depth = 0
    i = j
    while i > 0:
        c = text[i - 1]
        if c in ")]}":
            depth += 1
        elif c in "([{":
            if depth == 0:
                break
            depth -= 1
        elif depth == 0 and c in "+-*/<>=!^%,":
            break
        i -= 1
    return text[i:j]


def host_clock_subtractions(rules_text: str) -> list[str]:
    """``rule: operand`` for every time() minus an exporter series, or the reverse."""
    found = []
    for group in yaml.safe_load(rules_text)["groups"]:
        for rule in group["rules"]:
            name = rule.get("alert") or rule.get("record")
            expr = " ".join(str(rule["expr"]).split())
            for m in re.finditer(r"time\(\)\s*-", expr):
                operand = _operand_after(expr, m.end())
                if _EXPORTER.search(operand):
                    found.append(f"{name}: time() - {operand}")
            for m in re.finditer(r"-\s*time\(\)", expr):
                operand = _operand_before(expr, m.start())
                if _EXPORTER.search(operand):
                    found.append(f"{name}: {operand} - time()")
    return found


def test_no_rule_subtracts_a_host_timestamp_from_time() -> None:
    assert host_clock_subtractions(RULES.read_text(encoding="utf-8")) == []


def test_the_check_sees_the_shapes_it_looks_for(tmp_path: Path) -> None:
    """The shapes of the overdue branch CheckpointSavesFailing had (fixed in issue 41), and a
    Prometheus-side change time that is allowed."""
    doc = {
        "groups": [
            {
                "name": "g",
                "rules": [
                    {
                        "alert": "Wrapped",
                        "expr": "time()\n - (\n max by (run) (trainguard_x_timestamp_seconds)"
                        " > on (run) trainguard_y_timestamp_seconds ) > 600",
                    },
                    {"alert": "Reverse", "expr": "trainguard_x_timestamp_seconds - time() < 0"},
                    {"alert": "Fine", "expr": "time() - run:thing_since:time > 600"},
                ],
            }
        ]
    }
    found = host_clock_subtractions(yaml.safe_dump(doc))
    assert [f.split(":")[0] for f in found] == ["Wrapped", "Reverse"], found
