"""Generate trainguard's Grafana dashboards (``grafana/dashboards/*.json``) from code.

    python grafana/generate.py             # rewrite the committed JSON
    python grafana/generate.py --check     # write nothing; exit 1 if the committed JSON is stale
    python grafana/generate.py -o DIR      # write elsewhere
    python grafana/generate.py --set target_labels="cluster, namespace, region, job, instance" \
        --set leak_horizon=12h -o DIR      # a site's own dashboards (same options as the rules)

The dashboards follow the same site configuration as the rules (``alerts/site.py``):
``--set``, ``--config`` and ``--list`` are those of ``alerts/build.py``, so one set of
overrides gives rules and dashboards that agree. Panels that show what an alert judges draw
and name its threshold, and every aggregation and join keeps the site's target labels (all but
``job`` and ``instance``, by which a run's exporters differ).

Import it and call :func:`build_dashboards` for ``{filename: dashboard}`` and :func:`render`
for the committed text. The dashboards themselves are in :mod:`grafana.boards` (one module
each), built from :mod:`grafana.panels` and :mod:`grafana.dashboard`; :mod:`grafana.promql`
says what every query filters on and keeps, and why. The alerts the "Firing trainguard alerts"
table shows are read from the rules file, so the table follows the rules without a hand-kept
list.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `grafana` and `alerts` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

PROGRAM = "grafana/generate.py"
#: what to install where the SDK is missing (pyproject.toml's `dashboards` extra)
INSTALL_HINT = (
    "the dashboards are built with grafana-foundation-sdk, which is not installed: in the "
    "trainguard checkout, pip install '.[dashboards]' (or pip install 'trainguard[dashboards]')"
)

try:
    from grafana_foundation_sdk.builders import dashboard as db
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
except ModuleNotFoundError as exc:  # a plain install: say what to install, not a traceback
    if exc.name is None or not exc.name.startswith("grafana_foundation_sdk"):
        raise
    if __name__ == "__main__":
        sys.stderr.write(f"{PROGRAM}: error: {INSTALL_HINT}\n")
        sys.exit(2)
    raise ModuleNotFoundError(INSTALL_HINT, name=exc.name) from exc

from alerts import site as sites  # noqa: E402 - after the SDK's check
from grafana.boards import checkpoints, gpu_memory, runs  # noqa: E402

DASHBOARD_DIR = Path(__file__).resolve().parent / "dashboards"
RULES_FILE = Path(__file__).resolve().parents[1] / "alerts" / "trainguard.rules.yml"

# Alert names go into a PromQL regex unescaped: plain identifiers only.
_ALERT_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def alert_names(rules_file: Path = RULES_FILE) -> list[str]:
    """Every ``alert:`` name of a Prometheus rules file, sorted, each once, except the Watchdog's.

    Alerts of ``severity: none`` are left out (the Watchdog, which always fires: it tells of no
    problem).

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


def build_dashboards(
    rules_file: Path = RULES_FILE, site: sites.Site | None = None
) -> dict[str, dict[str, Any]]:
    """Return ``{filename: dashboard JSON model}`` for every trainguard dashboard.

    Built for ``site``'s thresholds and target labels (default: the thresholds' defaults).
    """
    site = sites.Site.of(site)
    boards = [
        runs.build(site, alert_names(rules_file)),
        gpu_memory.build(site),
        checkpoints.build(site),
    ]
    models = [_to_dict(board) for board in boards]
    return {f"{m['uid']}.json": m for m in models}


def render(dashboard: dict[str, Any]) -> str:
    """Serialise a dashboard the way it is committed."""
    return json.dumps(dashboard, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (0, 1 stale with ``--check``, 2 bad input)."""
    status, _ = sites.run_generator(
        argv,
        program=PROGRAM,
        doc=__doc__,
        epilog="The site configuration is the rules': see --list and alerts/README.md.",
        default=DASHBOARD_DIR,
        outputs=lambda site, output: {
            Path(output) / name: render(d) for name, d in build_dashboards(site=site).items()
        },
        one_file=False,
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
