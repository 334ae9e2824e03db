"""The site configuration: one Prometheus setup's thresholds and target labels.

It is the one input both generators read, so that the rules and the dashboards a site deploys
agree. The site-wide thresholds (``SITE_WIDE``: what every rule group uses) are declared here,
each group's at the top of its rule module (``alerts/rules/``); ``THRESHOLDS`` joins them and
:func:`resolve` checks overrides against them, by kind (``alerts/kinds.py``), so a typo is an
error naming the threshold and the kind of value it expects instead of a rule file Prometheus
rejects (or, worse, loads).

``alerts/build.py`` fills it into the rules; ``grafana/generate.py`` into the dashboards (the
thresholds the panels draw and name, the target labels every aggregation and join keeps). It
is built the same way for both, by the same command-line options (:func:`add_arguments`; the
whole command line of the generators that read a site is :func:`run_generator`): the
defaults (``THRESHOLDS``), then a ``--config`` file (a YAML mapping), then ``--set
KEY=VALUE`` (``--set`` wins). Each value is checked by its kind when the site is built, so a
typo is an error before either generator writes a thing.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import yaml

from alerts import kinds
from alerts.kinds import DURATION, LABELS, SELECTOR, URL, Threshold, ThresholdError, Value
from alerts.output import add_output_arguments, fail, regenerate_command, write_or_check
from alerts.rules import THRESHOLDS as GROUP_THRESHOLDS
from trainguard.exporter.config.yamlfile import ConfigError, load_yaml

#: the target labels that name one exporter; a run spans several (one per node)
EXPORTER_LABELS = ("job", "instance")

#: thresholds every rule group shares: how the rules find the scrape targets and tell them
#: apart, where the runbook lives, how often the slow recording rules run and how long alerts
#: on a lasting state keep firing
SITE_WIDE: tuple[Threshold, ...] = (
    Threshold(
        "job_selector",
        'job=~"trainguard.*"',
        SELECTOR,
        "Selector for Prometheus' own `up` series of the trainguard scrape job(s), used by "
        "TrainguardExporterDown; the other alerts select by metric name.",
    ),
    Threshold(
        "target_labels",
        "cluster, namespace, job, instance",
        LABELS,
        "Labels that identify a scrape target, kept by every aggregation and join of the rules "
        "(and used to select an alert's own series in annotation queries): on a global "
        "Prometheus or Thanos, runs of two clusters stay apart and alerts keep their routing "
        "labels. A label absent from the series costs nothing; add those your relabelling sets "
        "(node, region...). Must include job and instance.",
    ),
    Threshold(
        "runbook_base",
        'http://{{ or $labels.instance "localhost:9636" }}/runbook',
        URL,
        "Where the runbook lives; each alert links to <runbook_base>#<alertname lowercased>. "
        "The default is the runbook the exporter ships and serves at /runbook, on the "
        "exporter the alert is about (a job's alert across nodes: its lowest rank's exporter; "
        "the Watchdog: localhost:9636): right where instance is the exporter's host:port. "
        "deploy/kubernetes/build_prometheusrule.py defaults it to the exporters' Service "
        "instead (instance is the node's name there, with no port). Set your wiki's address "
        "here (https://wiki.example.com/trainguard), or https:// where the exporter serves TLS.",
    ),
    Threshold(
        "slow_rules_interval",
        "5m",
        DURATION,
        "Evaluation interval of the group trainguard.rules.slow: the recording rules over days "
        "([7d] changes, max_over_time, min_over_time), too costly to evaluate every 15s. Their "
        "readers look back 3 intervals (last_over_time), so a late evaluation leaves no gap.",
    ),
    Threshold(
        "pace_rules_interval",
        "1m",
        DURATION,
        "Evaluation interval of the group trainguard.rules.pace: a run's completed intervals "
        "between steps, its step rate and TrainingThroughputDropped, judged over minutes. Never "
        "longer than slow_rules_interval (it is shortened to that), whose records read its own.",
    ),
    Threshold(
        "window_rules_interval",
        "1m",
        DURATION,
        "Evaluation interval of the .window groups: the alerts on a condition judged over 5 "
        "minutes or more (a window, a `for` or both), and the records only they read "
        "(GPUGhostMemory, GPUUnattributedMemory, DuplicateHostProcess, GPUHardwareSlowdown, "
        "GPUPcieLinkDegraded, GPUNvLinkErrors, AllocatorRetrying, AllocatorMemoryLeak, "
        "AllocatorFragmentation, CheckpointStale, CheckpointNeverCompleted, "
        "CheckpointUnknownMtime, CheckpointUnrecordedFiles, CheckpointPartialOrphaned, "
        "CheckpointVolumeFillingUp, CheckpointWillNotFit, StepsAtRisk): each fires and "
        "resolves up to this much later than at a 15s evaluation. Deaths, stalls, OOMs, "
        "Xid errors, failing GPU memory, damaged checkpoints and memory left after a run's "
        "death stay at the global interval. Never longer than slow_rules_interval (it is "
        "shortened to that); at most half of ghost_window, whose minimum reads its records.",
    ),
    Threshold(
        "keep_firing_for",
        "10m",
        DURATION,
        "TrainingProcessDied and the other alerts on a lasting state of a run keep firing this "
        "long after their condition was last seen (Prometheus' keep_firing_for): a missed scrape, "
        "an exporter or Prometheus restart must not resolve them and page a second time.",
    ),
)

# Order matters: it is the order of the generated file's header and of --list.
THRESHOLDS: tuple[Threshold, ...] = (*SITE_WIDE, *GROUP_THRESHOLDS)

BY_NAME: Mapping[str, Threshold] = MappingProxyType({t.name: t for t in THRESHOLDS})
DEFAULTS: Mapping[str, Value] = MappingProxyType({t.name: t.default for t in THRESHOLDS})


def _check_names(overrides: Mapping[str, object]) -> None:
    for key in overrides:
        if key not in BY_NAME:
            raise ThresholdError(f"unknown threshold {key!r}; known: {', '.join(sorted(BY_NAME))}")


def _placeholders(threshold: Threshold, value: object) -> dict[str, str]:
    try:
        parts = threshold.kind.placeholders(value)
    except ValueError as exc:
        kind = threshold.kind
        raise ThresholdError(
            f"threshold {threshold.name} ({kind.name}): {exc}; expected e.g. {kind.hint}"
        ) from None
    return {threshold.name + suffix: text for suffix, text in parts.items()}


def resolve(overrides: Mapping[str, object] | None = None) -> dict[str, str]:
    """Validate overrides and return the placeholder table of the rule templates.

    For a duration ``k``: ``${k}`` is the PromQL duration, ``${k_s}`` the seconds. For a byte
    size ``k``: ``${k}`` is the integer, ``${k_h}`` a human string such as 2GiB.
    """
    overrides = overrides or {}
    _check_names(overrides)
    table: dict[str, str] = {}
    for threshold in THRESHOLDS:
        table.update(_placeholders(threshold, overrides.get(threshold.name, threshold.default)))
    # the pace group feeds the slow group: never evaluated less often than it
    if int(table["pace_rules_interval_s"]) > int(table["slow_rules_interval_s"]):
        table["pace_rules_interval"] = table["slow_rules_interval"]
        table["pace_rules_interval_s"] = table["slow_rules_interval_s"]
    if int(table["window_rules_interval_s"]) > int(table["slow_rules_interval_s"]):
        table["window_rules_interval"] = table["slow_rules_interval"]
        table["window_rules_interval_s"] = table["slow_rules_interval_s"]
    if 2 * int(table["window_rules_interval_s"]) > int(table["ghost_window_s"]):
        raise ThresholdError(
            f"threshold ghost_window ({table['ghost_window']}) must be at least twice "
            f"window_rules_interval ({table['window_rules_interval']}): GPUGhostMemory's "
            "minimum over it would hold one record or none"
        )
    if int(table["stall_gap_lookback_s"]) <= 2 * int(table["pace_rules_interval_s"]):
        raise ThresholdError(
            f"threshold stall_gap_lookback ({table['stall_gap_lookback']}) must be more than "
            f"twice pace_rules_interval ({table['pace_rules_interval']}): the pace group would "
            "miss the intervals that end between its evaluations"
        )
    # how far a reader of the slow group's series looks back: three of its intervals
    table["slow_rules_lookback"] = kinds.format_duration(3 * int(table["slow_rules_interval_s"]))
    return table


def shown(table: Mapping[str, str]) -> dict[str, str]:
    """Each threshold's value as people write it (2GiB, not 2147483648), in THRESHOLDS order."""
    return {t.name: table[t.name + t.kind.shown] for t in THRESHOLDS}


# ------------------------------------------------------------------------- the site


@dataclass(frozen=True)
class Site:
    """One site's thresholds, resolved and checked.

    ``table`` is the placeholder table of the rule templates (:func:`resolve`);
    the methods are typed views of it for the dashboards.
    """

    table: Mapping[str, str]

    @classmethod
    def of(cls, config: Site | Mapping[str, object] | None = None) -> Site:
        """The site of ``config``: a site as it is, or overrides of the defaults (checked)."""
        if isinstance(config, Site):
            return config
        return cls(resolve(config))

    def _get(self, name: str) -> str:
        try:
            return self.table[name]
        except KeyError:
            raise KeyError(f"no threshold {name!r} in the site configuration") from None

    def duration(self, name: str) -> str:
        """A duration threshold as PromQL writes it (``10m``), e.g. for a range selector."""
        return self._get(name)

    def seconds(self, name: str) -> int:
        """A duration threshold in seconds."""
        return int(self._get(name + "_s"))

    def bytes(self, name: str) -> int:
        """A byte-size threshold in bytes."""
        return int(self._get(name))

    def number(self, name: str) -> int | float:
        """A number threshold: an int where it is whole (3, drawn as 3 and not 3.0)."""
        value = float(self._get(name))
        return int(value) if value.is_integer() else value

    def shown(self, name: str) -> str:
        """A threshold as people write it (``2GiB``, ``0.5``, ``10m``), for descriptions."""
        return shown(self.table)[name]

    @property
    def target_labels(self) -> tuple[str, ...]:
        """The labels that identify a scrape target, in the order the site gave them."""
        return tuple(name.strip() for name in self._get("target_labels").split(","))

    @property
    def run_labels(self) -> tuple[str, ...]:
        """The target labels that tell two same-named runs apart: all but job and instance.

        A run spans exporters (one per node), but never two clusters, namespaces or regions.
        The dashboards, which aggregate a run over its exporters, keep these in every
        aggregation and join.
        """
        return tuple(name for name in self.target_labels if name not in EXPORTER_LABELS)


# ------------------------------------------------------------------------- the command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--set``, ``--config`` and ``--list``: the same in every generator that reads a site."""
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one threshold (repeatable; wins over --config)",
    )
    parser.add_argument("--config", type=Path, help="YAML file: a mapping of threshold overrides")
    parser.add_argument(
        "--list", action="store_true", help="print every threshold and its meaning, and exit"
    )


def from_arguments(args: argparse.Namespace) -> Site:
    """The site of parsed :func:`add_arguments` options.

    Raises ``ThresholdError`` (a ``ValueError``) for a bad override and ``OSError`` for a
    config file that cannot be read.
    """
    overrides: dict[str, object] = {}
    if args.config is not None:
        overrides.update(load_config(args.config))
    overrides.update(parse_set(args.set))
    return Site.of(overrides)


def run_generator(
    argv: Sequence[str] | None,
    *,
    program: str,
    doc: str | None,
    epilog: str,
    default: Path,
    outputs: Callable[[Site, str], Mapping[Path, str]],
    one_file: bool = True,
) -> tuple[int, argparse.Namespace | None]:
    """The command line of a generator that reads a site: options, ``--list``, build, write.

    ``alerts/build.py``, ``grafana/generate.py`` and ``mixin/build.py`` take the same options
    (the site's ``--set``, ``--config`` and ``--list``; ``-o`` and ``--check``) and answer bad
    input the same way (exit 2, one line): one parser keeps them from drifting apart.
    ``outputs(site, output)`` builds ``{path: text}``; an output of several files
    (``one_file=False``) refuses ``-o -``. Returns the exit status and the parsed options, which
    are None when nothing was written nor checked (``--list``, bad input).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog=program, description=(doc or "").splitlines()[0], epilog=epilog
    )
    add_output_arguments(parser, default)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        site = from_arguments(args)
        if args.list:
            sys.stdout.write(listing(site))
            return 0, None
        if not one_file and args.output == "-":
            return fail(program, "-o -: the output is several files; give a directory"), None
        files = outputs(site, args.output)
    except (OSError, yaml.YAMLError, ValueError) as exc:
        return fail(program, str(exc)), None
    command = regenerate_command(program, argv)
    return write_or_check(files, check=args.check, command=command), args


def parse_set(items: Sequence[str]) -> dict[str, str]:
    """``--set KEY=VALUE`` arguments as a mapping (later ones win)."""
    overrides: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ThresholdError(f"--set expects KEY=VALUE, got {item!r}")
        overrides[key.strip()] = value.strip()
    return overrides


def load_config(path: Path) -> dict[str, object]:
    """Read a ``--config`` file: a flat YAML mapping of threshold name to value.

    It is read as the exporter reads its config file (size cap, duplicate keys refused, line and
    column).
    """
    try:
        loaded = load_yaml(path, "thresholds file")
    except ConfigError as exc:
        raise ThresholdError(str(exc)) from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict) or not all(isinstance(k, str) for k in loaded):
        raise ThresholdError(f"{path}: expected a mapping of threshold: value")
    return loaded


def listing(site: Site) -> str:
    """``--list``: every threshold with its kind and meaning as comments, its value as YAML.

    So the output is also a starting point for ``--config``.
    """
    values = shown(site.table)
    lines = []
    for t in THRESHOLDS:
        doc = textwrap.wrap(f"{t.doc} [{t.kind.name}]", width=96)
        lines += [f"# {line}" for line in doc]
        value: object = values[t.name]
        if t.kind is kinds.NUMBER:  # 3, not '3'
            value = yaml.safe_load(values[t.name])
        dumped = yaml.safe_dump({t.name: value}, width=1000, allow_unicode=True)
        lines.append(dumped.rstrip("\n"))
    return "\n".join(lines) + "\n"
