"""The one convention of trainguard's generators: write by default, ``--check`` for staleness.

The generators are ``alerts/build.py``, ``grafana/generate.py``, ``mixin/build.py`` and
``deploy/kubernetes/build_prometheusrule.py``. Each writes its committed output by default,
``-o/--output`` writes elsewhere (``-``: standard output, for a single file), and ``--check``
writes nothing and exits 1 when the committed output is stale, naming the command that
regenerates it. Bad input exits 2 with a one-line error.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


class Folded(str):
    """A long one-line string (an annotation), written as a folded YAML block for readability."""


class _Dumper(yaml.SafeDumper):
    """Block style for the rules: PromQL of several lines literal, a long annotation folded.

    PyYAML quotes a string that neither block can hold exactly (trailing spaces on a line).
    """


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


def _folded_representer(dumper: yaml.SafeDumper, data: Folded) -> yaml.ScalarNode:
    style = ">" if len(data) > 60 else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(data), style=style)


_Dumper.add_representer(str, _str_representer)
_Dumper.add_representer(Folded, _folded_representer)


def dump_yaml(data: object) -> str:
    """The one YAML writer of rules: the rules file and the PrometheusRule that carries them."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)


def add_output_arguments(parser: argparse.ArgumentParser, default: Path) -> None:
    """``-o/--output`` (defaulting to the committed path) and ``--check``."""
    parser.add_argument(
        "-o",
        "--output",
        default=str(default),
        help="where to write; '-' for standard output where the output is one file "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if the output differs from what would be generated",
    )


def regenerate_command(program: str, argv: Sequence[str]) -> str:
    """How to rebuild what ``--check`` compared: the same command without ``--check``."""
    return shlex.join(["python", program, *(a for a in argv if a != "--check")])


def write_or_check(outputs: Mapping[Path, str], *, check: bool, command: str) -> int:
    """Write every ``{path: text}`` (or with ``check``, compare); return the exit status.

    ``command`` is how a user regenerates them, quoted in the stale message.
    """
    if check:
        if any(str(path) == "-" for path in outputs):
            print("error: --check compares with a file: give -o FILE, not -o -", file=sys.stderr)
            return 2
        stale = [
            str(path)
            for path, text in outputs.items()
            if not path.exists() or path.read_text(encoding="utf-8") != text
        ]
        for name in stale:
            print(f"{name} is stale: run {command}", file=sys.stderr)
        return 1 if stale else 0
    for path, text in outputs.items():
        if str(path) == "-":
            sys.stdout.write(text)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}", file=sys.stderr)
    return 0


def fail(program: str, message: str) -> int:
    """Report bad input the same way in every generator; returns the exit status (2)."""
    print(f"{program}: error: {message}", file=sys.stderr)
    return 2
