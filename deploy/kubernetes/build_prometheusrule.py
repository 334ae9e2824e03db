"""Build deploy/kubernetes/prometheusrule.yaml from the alert rules.

    python deploy/kubernetes/build_prometheusrule.py          # write it
    python deploy/kubernetes/build_prometheusrule.py --check  # exit 1 if it is out of date
    python deploy/kubernetes/build_prometheusrule.py --set runbook_base=https://wiki/tg -o -
    python deploy/kubernetes/build_prometheusrule.py --rules my.rules.yml -o -   # to stdout

The PrometheusRule (Prometheus Operator) carries the groups ``alerts/build.py`` renders, with
the same site options (``--set``, ``--config``), so the alerts are the same with or without the
operator, but for one default: the runbook link. The rule file's default links to
``http://<instance>/runbook``, the exporter a scrape names; the shipped ServiceMonitor
relabels ``instance`` to the node's name without a port and the DaemonSet has no hostPort, so
that link would open port 80 of the node. Here ``runbook_base`` defaults to the exporters'
Service (its name, namespace and port read from service.yaml, so they cannot drift apart):
every exporter serves the same runbook. Set your wiki's or an ingress's address with ``--set
runbook_base=...`` where people click from outside the cluster. ``--rules`` wraps a rule file
of your own, unchanged. Edit the rules, never the generated manifest.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

if __package__ in (None, ""):  # run as a script: make `alerts` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from alerts import build as rules_build
from alerts import site as sites
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
SERVICE = Path(__file__).resolve().parent / "service.yaml"

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


def service_runbook_base(service_file: Path = SERVICE) -> str:
    """``http://<service>.<namespace>.svc:<port>/runbook``: the exporters behind their Service."""
    service = yaml.safe_load(service_file.read_text(encoding="utf-8"))
    meta = service["metadata"]
    port = service["spec"]["ports"][0]["port"]
    return f"http://{meta['name']}.{meta['namespace']}.svc:{port}/runbook"


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


def rendered_groups(overrides: Mapping[str, object] | None = None) -> list[dict[str, Any]]:
    """The groups alerts/build.py renders for the site, the Service's runbook by default."""
    site = {"runbook_base": service_runbook_base(), **(overrides or {})}
    groups: list[dict[str, Any]] = yaml.safe_load(rules_build.render(site))["groups"]
    return groups


def build(
    groups: list[dict[str, Any]], name: str = NAME, namespace: str = NAMESPACE
) -> dict[str, Any]:
    """The PrometheusRule object for ``groups``."""
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
        "spec": {"groups": _folded(groups)},
    }


def render(rules_file: Path | None = None, overrides: Mapping[str, object] | None = None) -> str:
    """The manifest text, as committed: the rules rendered for the site (``overrides``), or
    ``rules_file``'s groups unchanged."""
    if rules_file is None:
        source = "alerts/rules (alerts/build.py, runbook_base: the exporters' Service)"
        groups = rendered_groups(overrides)
    else:
        try:
            source = rules_file.resolve().relative_to(REPO).as_posix()
        except ValueError:
            source = rules_file.name
        groups = load_groups(rules_file)
    header = (
        f"# GENERATED from {source} by deploy/kubernetes/build_prometheusrule.py: do not edit.\n"
        "# Prometheus Operator: its Prometheus selects PrometheusRules by label\n"
        "# (kube-prometheus-stack: `release: <helm release name>`): add that label here.\n"
    )
    return header + dump_yaml(build(groups))


def main(argv: Sequence[str] | None = None) -> int:
    """Command line; exit status 0, 1 (``--check``: stale) or 2 (bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog=PROGRAM, description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--rules", type=Path, default=None, help="a rule file of your own to wrap unchanged"
    )
    sites.add_arguments(parser)
    add_output_arguments(parser, OUTPUT)
    args = parser.parse_args(argv)

    try:
        if args.list:
            sys.stdout.write(sites.listing(sites.from_arguments(args)))
            return 0
        overrides: dict[str, object] = {}
        if args.config is not None:
            overrides.update(sites.load_config(args.config))
        overrides.update(sites.parse_set(args.set))
        text = render(args.rules, overrides)
    except FileNotFoundError:
        return fail(PROGRAM, f"{args.rules}: no such rule file")
    except (ValueError, OSError) as exc:
        return fail(PROGRAM, str(exc))
    return write_or_check(
        {Path(args.output): text}, check=args.check, command=regenerate_command(PROGRAM, argv)
    )


if __name__ == "__main__":
    sys.exit(main())
