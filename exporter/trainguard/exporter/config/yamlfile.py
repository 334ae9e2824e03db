"""The one reader of trainguard's YAML files.

They are ``--config.file``, ``--web.config.file``, and the alert thresholds' ``--config``.

Both files are small, hand-written and read once at start, so reading is strict: a size cap
(a file that big is a mistake, never a config), safe loading (no Python tags), duplicate keys
refused (YAML would silently keep the last one), and every error names the file, the line and
the column. The mappings and lists it returns remember where each of their entries was written,
so that :mod:`trainguard.exporter.config.schema` can name the line of a field whose value is wrong,
not only of a YAML syntax error.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

#: the largest file read; a config of a few hundred runs is a few tens of KiB
MAX_BYTES = 1024 * 1024
_MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass(frozen=True)
class Mark:
    """Where something was written: 1-based line and column."""

    line: int
    column: int

    @classmethod
    def of(cls, mark: yaml.Mark | None) -> Mark | None:
        return None if mark is None else cls(mark.line + 1, mark.column + 1)


class ConfigError(ValueError):
    """A file that cannot be used: names the file, where in it, the field and what was expected.

    Reads ``FILE:LINE:COLUMN: FIELD: MESSAGE`` (the form compilers use, so an editor can jump
    to it), or ``FILE: FIELD: MESSAGE`` where the position is unknown.
    """

    def __init__(
        self, source: str, message: str, *, field: str = "", mark: Mark | None = None
    ) -> None:
        self.source = source
        self.field = field
        self.mark = mark
        self.message = message
        where = f"{source}:{mark.line}:{mark.column}" if mark else source
        super().__init__(f"{where}: {field}: {message}" if field else f"{where}: {message}")


class Located(dict[Any, Any]):
    """A YAML mapping that remembers where each key and its value were written."""

    def __init__(self) -> None:
        super().__init__()
        self.mark: Mark | None = None
        self.keys_at: dict[Any, Mark | None] = {}
        self.values_at: dict[Any, Mark | None] = {}


class LocatedList(list[Any]):
    """A YAML sequence that remembers where each item was written."""

    def __init__(self) -> None:
        super().__init__()
        self.mark: Mark | None = None
        self.items_at: list[Mark | None] = []


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and keeps marks on mappings and sequences."""

    def construct_located_map(self, node: MappingNode) -> Iterator[Located]:
        data = Located()
        data.mark = Mark.of(node.start_mark)
        yield data
        self._refuse_duplicates(node)
        data.update(self.construct_mapping(node))  # also merges "<<" keys into node.value
        for key_node, value_node in node.value:
            key = self.construct_object(key_node)  # constructed already: the same object
            data.keys_at[key] = Mark.of(key_node.start_mark)
            data.values_at[key] = Mark.of(value_node.start_mark)

    def construct_located_seq(self, node: SequenceNode) -> Iterator[LocatedList]:
        data = LocatedList()
        data.mark = Mark.of(node.start_mark)
        yield data
        data.extend(self.construct_sequence(node))
        data.items_at = [Mark.of(n.start_mark) for n in node.value]

    def _refuse_duplicates(self, node: MappingNode) -> None:
        first: dict[Hashable, Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue  # "<<: *defaults" then overriding a key is what merging is for
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                continue  # construct_mapping reports it
            if key in first:
                raise yaml.constructor.ConstructorError(
                    f"in a mapping (line {first[key].start_mark.line + 1})",
                    node.start_mark,
                    f"duplicate key {key!r}, first given on line {first[key].start_mark.line + 1}",
                    key_node.start_mark,
                )
            first[key] = key_node


_Loader.add_constructor("tag:yaml.org,2002:map", _Loader.construct_located_map)
_Loader.add_constructor("tag:yaml.org,2002:seq", _Loader.construct_located_seq)


def parse_yaml(text: str, source: str) -> Any:
    """The one document in text, with mappings and sequences that know their positions.

    Mappings come as :class:`Located`, sequences as :class:`LocatedList`; raises
    :class:`ConfigError` with line and column if it is not safe YAML.
    """
    try:
        return yaml.load(text, Loader=_Loader)  # a SafeLoader: no Python tags
    except yaml.MarkedYAMLError as exc:
        problem = exc.problem or exc.context or "not YAML"
        if exc.context and problem.startswith("but "):  # "expected a single document ..."
            problem = f"{exc.context}, {problem}"
        raise ConfigError(
            source, f"invalid YAML: {problem}", mark=Mark.of(exc.problem_mark or exc.context_mark)
        ) from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow
        before = text[: exc.position]
        mark = Mark(before.count("\n") + 1, exc.position - (before.rfind("\n") + 1) + 1)
        raise ConfigError(
            source, f"invalid YAML: character #x{exc.character:04x} is not allowed", mark=mark
        ) from None
    except RecursionError:
        raise ConfigError(source, "invalid YAML: nested too deeply") from None


def load_yaml(path: str | Path, what: str = "config file", max_bytes: int = MAX_BYTES) -> Any:
    """Read and parse a YAML file of at most max_bytes.

    Errors name the file (and ``what`` it is, in "cannot read web config file: ...").
    """
    source = str(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigError(source, f"cannot read {what}: {exc.strerror or exc}") from None
    if len(raw) > max_bytes:
        raise ConfigError(
            source, f"{what} is larger than {_size(max_bytes)}: not a config; check the path"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = raw[: exc.start]  # the column counts bytes here
        mark = Mark(before.count(b"\n") + 1, exc.start - (before.rfind(b"\n") + 1) + 1)
        raise ConfigError(source, f"not UTF-8 text ({exc.reason})", mark=mark) from None
    return parse_yaml(text, source)


def _size(n: int) -> str:
    return f"{n // 1024 // 1024} MiB" if n % (1024 * 1024) == 0 else f"{n} bytes"
