"""Build deploy/kubernetes/prometheusrule.yaml from the Prometheus rule file.

    python deploy/kubernetes/build_prometheusrule.py          # write it
    python deploy/kubernetes/build_prometheusrule.py --check  # exit 1 if it is out of date
    python deploy/kubernetes/build_prometheusrule.py --rules my.rules.yml -o -   # to stdout

The PrometheusRule (Prometheus Operator) carries the same ``groups`` as
``alerts/trainguard.rules.yml``, unchanged, so the alerts are the same with or without the
operator. Edit the rule file, never the generated manifest.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

if __package__ in (None, ""):  # run as a script: make `alerts` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from alerts.output import (
    Folded,
    add_output_arguments,
    dump_yaml,
    fail,
    regenerate_command,
    write_or_check,
)

REPO = Path(__file__).resolve().parents[2]
PROGRAM = "deploy/kubernetes/build_prometheusrule.py"
RULES_FILE = REPO / "alerts" / "trainguard.rules.yml"
OUTPUT = Path(__file__).resolve().parent / "prometheusrule.yaml"

NAME = "trainguard"
NAMESPACE = "monitoring"


def _folded(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The groups with their annotations (but the link) marked as the rules file writes them."""
    for group in groups:
        for rule in group["rules"]:
            annotations = rule.get("annotations") or {}
            for key, value in annotations.items():
                if isinstance(value, str) and key != "runbook_url":
                    annotations[key] = Folded(value)
    return groups


def load_groups(rules_file: Path) -> list[dict[str, Any]]:
    """The ``groups`` of a Prometheus rule file, checked for the shape the operator needs."""
    try:
        data = yaml.safe_load(rules_file.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ValueError(f"{rules_file}: not YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict) or not isinstance(data.get("groups"), list):
        raise ValueError(f"{rules_file}: not a Prometheus rule file (no top-level 'groups' list)")
    extra = sorted(set(data) - {"groups"})
    if extra:
        raise ValueError(f"{rules_file}: unexpected top-level keys {extra}")
    for i, group in enumerate(data["groups"]):
        if not isinstance(group, dict) or "name" not in group or "rules" not in group:
            raise ValueError(f"{rules_file}: group {i} needs 'name' and 'rules'")
    groups: list[dict[str, Any]] = data["groups"]
    return groups


def build(
    rules_file: Path = RULES_FILE, name: str = NAME, namespace: str = NAMESPACE
) -> dict[str, Any]:
    """The PrometheusRule object for ``rules_file``."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": "trainguard",
                "app.kubernetes.io/part-of": "trainguard",
                "app.kubernetes.io/component": "alert-rules",
            },
        },
        "spec": {"groups": _folded(load_groups(rules_file))},
    }


def render(rules_file: Path = RULES_FILE) -> str:
    """The manifest text, as committed."""
    try:
        source = rules_file.resolve().relative_to(REPO).as_posix()
    except ValueError:
        source = rules_file.name
    header = (
        f"# GENERATED from {source} by deploy/kubernetes/build_prometheusrule.py: do not edit.\n"
        "# Prometheus Operator: its Prometheus selects PrometheusRules by label\n"
        "# (kube-prometheus-stack: `release: <helm release name>`): add that label here.\n"
    )
    return header + dump_yaml(build(rules_file))


def main(argv: Sequence[str] | None = None) -> int:
    """Command line; exit status 0, 1 (``--check``: stale) or 2 (bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog=PROGRAM, description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--rules", type=Path, default=RULES_FILE, help="rule file to wrap (default: %(default)s)"
    )
    add_output_arguments(parser, OUTPUT)
    args = parser.parse_args(argv)

    try:
        text = render(args.rules)
    except FileNotFoundError:
        return fail(PROGRAM, f"{args.rules}: no such rule file")
    except (ValueError, OSError) as exc:
        return fail(PROGRAM, str(exc))
    return write_or_check(
        {Path(args.output): text}, check=args.check, command=regenerate_command(PROGRAM, argv)
    )


if __name__ == "__main__":
    sys.exit(main())
