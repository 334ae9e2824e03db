"""Generate trainguard's Grafana dashboards (``grafana/dashboards/*.json``) from code.

    python grafana/generate.py             # rewrite the committed JSON
    python grafana/generate.py --check     # write nothing; exit 1 if the committed JSON is stale
    python grafana/generate.py -o DIR      # write elsewhere

Import it and call :func:`build_dashboards` for ``{filename: dashboard}`` and :func:`render`
for the committed text. The dashboards themselves are in :mod:`grafana.boards` (one module
each), built from :mod:`grafana.panels`, which says what every query filters on and why. The
alerts the "Firing trainguard alerts" table shows are read from the rules file, so the table
follows the rules without a hand-kept list.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `grafana` and `alerts` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from alerts.output import add_output_arguments, fail, write_or_check
from grafana.boards import checkpoints, gpu_memory, runs

DASHBOARD_DIR = Path(__file__).resolve().parent / "dashboards"
RULES_FILE = Path(__file__).resolve().parents[1] / "alerts" / "trainguard.rules.yml"
PROGRAM = "grafana/generate.py"
COMMAND = f"python {PROGRAM}"  # how the stale message tells a user to regenerate

# Alert names go into a PromQL regex unescaped: plain identifiers only.
_ALERT_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def alert_names(rules_file: Path = RULES_FILE) -> list[str]:
    """Every ``alert:`` name of a Prometheus rules file, sorted, each once; except alerts of
    ``severity: none`` (the Watchdog, which always fires: it tells of no problem).

    Raises ``OSError``, ``yaml.YAMLError`` or ``ValueError`` (not a rules file, no alerts, a
    name that is not a plain identifier).
    """
    doc = yaml.safe_load(rules_file.read_text(encoding="utf-8"))
    groups = doc.get("groups") if isinstance(doc, dict) else None
    if not isinstance(groups, list):
        raise ValueError(f"{rules_file}: no 'groups' list: not a Prometheus rules file")
    names = {
        rule["alert"]
        for group in groups
        for rule in (group or {}).get("rules") or []
        if isinstance(rule, dict)
        and "alert" in rule
        and (rule.get("labels") or {}).get("severity") != "none"
    }
    if not names:
        raise ValueError(f"{rules_file}: no alerting rules")
    for name in names:
        if not isinstance(name, str) or not _ALERT_NAME_RE.fullmatch(name):
            raise ValueError(f"{rules_file}: alert name {name!r} is not a plain identifier")
    return sorted(names)


def _to_dict(builder: db.Dashboard) -> dict[str, Any]:
    """The dashboard's JSON model, panels numbered 1, 2, 3... (the SDK leaves ids at 0)."""
    d: dict[str, Any] = json.loads(JSONEncoder(sort_keys=True).encode(builder.build()))
    next_id = 1

    def number(panels: list[dict[str, Any]]) -> None:
        nonlocal next_id
        for p in panels:
            p["id"] = next_id
            next_id += 1
            number(p.get("panels", []))

    number(d.get("panels", []))
    return d


def build_dashboards(rules_file: Path = RULES_FILE) -> dict[str, dict[str, Any]]:
    """Return ``{filename: dashboard JSON model}`` for every trainguard dashboard."""
    boards = [runs.build(alert_names(rules_file)), gpu_memory.build(), checkpoints.build()]
    models = [_to_dict(board) for board in boards]
    return {f"{m['uid']}.json": m for m in models}


def render(dashboard: dict[str, Any]) -> str:
    """Serialise a dashboard the way it is committed."""
    return json.dumps(dashboard, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (0, 1 stale with ``--check``, 2 bad input)."""
    parser = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.splitlines()[0])
    add_output_arguments(parser, DASHBOARD_DIR)
    args = parser.parse_args(argv)
    if args.output == "-":
        return fail(parser.prog, "-o -: the dashboards are several files; give a directory")
    try:
        dashboards = build_dashboards()
    except (OSError, yaml.YAMLError, ValueError) as e:
        return fail(parser.prog, str(e))
    out = Path(args.output)
    outputs = {out / name: render(d) for name, d in dashboards.items()}
    return write_or_check(outputs, check=args.check, command=COMMAND)


if __name__ == "__main__":
    sys.exit(main())
