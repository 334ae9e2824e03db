"""The site configuration: one Prometheus setup's thresholds and target labels.

It is the one input both generators read, so that the rules and the dashboards a site deploys
agree.

``alerts/build.py`` fills it into the rules; ``grafana/generate.py`` into the dashboards (the
thresholds the panels draw and name, the target labels every aggregation and join keeps). It
is built the same way for both, by the same command-line options (:func:`add_arguments`): the
defaults of ``alerts/thresholds/``, then a ``--config`` file (a YAML mapping), then ``--set
KEY=VALUE`` (``--set`` wins). Each value is checked by its kind when the site is built, so a
typo is an error before either generator writes a thing.
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from alerts import kinds, thresholds
from alerts.thresholds import ThresholdError
from trainguard.exporter.config.yamlfile import ConfigError, load_yaml

#: the target labels that name one exporter; a run spans several (one per node)
EXPORTER_LABELS = ("job", "instance")


@dataclass(frozen=True)
class Site:
    """One site's thresholds, resolved and checked.

    ``table`` is the placeholder table of the rule templates (:func:`alerts.thresholds.resolve`);
    the methods are typed views of it for the dashboards.
    """

    table: Mapping[str, str]

    @classmethod
    def of(cls, config: Site | Mapping[str, object] | None = None) -> Site:
        """The site of ``config``: a site as it is, or overrides of the defaults (checked)."""
        if isinstance(config, Site):
            return config
        return cls(thresholds.resolve(config))

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
        return thresholds.shown(self.table)[name]

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
    values = thresholds.shown(site.table)
    lines = []
    for t in thresholds.THRESHOLDS:
        doc = textwrap.wrap(f"{t.doc} [{t.kind.name}]", width=96)
        lines += [f"# {line}" for line in doc]
        value: object = values[t.name]
        if t.kind is kinds.NUMBER:  # 3, not '3'
            value = yaml.safe_load(values[t.name])
        dumped = yaml.safe_dump({t.name: value}, width=1000, allow_unicode=True)
        lines.append(dumped.rstrip("\n"))
    return "\n".join(lines) + "\n"
