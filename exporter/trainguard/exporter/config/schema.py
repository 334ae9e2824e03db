"""The dataclass is the schema: one validator turns a YAML document into frozen dataclasses.

Each field that a file may set carries its YAML key, its converter and a line of doc in its
``metadata`` (see :func:`key`); the keys a section allows, which ones are required (no
default) and how each is read all come from the dataclass, so there is no second list to keep
in step with it. This is exporter-toolkit's model (Go structs tagged with their YAML names,
unmarshalled strictly) in Python. A dataclass checks rules across its fields in
``__post_init__`` by raising :class:`FieldError`; the validator adds the file, the field's path
(``runs[2].checkpoints.mirrors.backup``) and its line and column, and raises
:class:`~trainguard.exporter.config.yamlfile.ConfigError`. A null value counts as not given.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from trainguard.exporter.config.yamlfile import ConfigError, Located, LocatedList, Mark
from trainguard.shared import fields, units

T = TypeVar("T")
Convert = Callable[["Value"], Any]
_NAME_RE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


class FieldError(ValueError):
    """A rule across fields broken, raised by a schema dataclass's ``__post_init__``.

    field is the attribute it is about, or "" for the whole section.
    """

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


@dataclasses.dataclass(frozen=True)
class Key:
    """How a dataclass field is written in YAML: its key, its converter, what it means."""

    name: str | None
    convert: Convert
    doc: str


def key(convert: Convert, doc: str, *, name: str | None = None) -> dict[str, Key]:
    """Field metadata making the field a YAML key (named ``name``, default the field's own)."""
    return {"yaml": Key(name, convert, doc)}


def keys(cls: type) -> dict[str, tuple[dataclasses.Field[Any], Key]]:
    """The YAML keys of a schema dataclass, in declaration order, with their fields."""
    out = {}
    for f in dataclasses.fields(cls):
        meta = f.metadata.get("yaml")
        if meta is not None:
            out[meta.name or f.name] = (f, meta)
    return out


class Value(fields.Node):
    """A value of the document with its path and position: what converters read.

    The checks and the path are :mod:`trainguard.shared.fields`' (the heartbeat reader's too); an
    error is a :class:`~trainguard.exporter.config.yamlfile.ConfigError` with the line and column.
    """

    __slots__ = ("base", "mark", "source")
    dialect = fields.WRITTEN

    def __init__(
        self, raw: Any, path: str, mark: Mark | None, source: str, base: Path | None = None
    ) -> None:
        super().__init__(raw, path)
        self.mark = mark
        self.source = source
        self.base = base
        """the directory of the file, for paths written relative to it"""

    @classmethod
    def root(cls, data: Any, source: str, base: Path | None = None) -> Value:
        """The whole document.

        It comes from :func:`~trainguard.exporter.config.yamlfile.load_yaml`, or is any plain value,
        which has no positions.
        """
        return cls(data, "", getattr(data, "mark", None), source, base)

    def error(self, path: str, message: str) -> ConfigError:
        return ConfigError(self.source, message, field=path or "<top level>", mark=self.mark)

    def _at(self, path: str, raw: Any, mark: Mark | None) -> Value:
        return Value(raw, path, mark or self.mark, self.source, self.base)

    def child(self, name: Any) -> Value:
        """The value of a key of this mapping (its raw value None when not given)."""
        raw = self.raw if isinstance(self.raw, dict) else {}
        at = raw.values_at.get(name) if isinstance(raw, Located) else None
        return self._at(fields.join(self.path, name), raw.get(name), at)

    def key_of(self, name: Any) -> Value:
        """A key of this mapping itself, for errors about the key (unknown, a bad name)."""
        at = self.raw.keys_at.get(name) if isinstance(self.raw, Located) else None
        return self._at(fields.join(self.path, name), name, at)

    def mapping(self, what: str = "a mapping") -> dict[Any, Any]:
        self.check(fields.mapping(self.raw, None, self.dialect, what))
        return self.raw

    def items(self) -> Iterator[Value]:
        self.check(fields.sequence(self.raw, None, self.dialect))
        marks = self.raw.items_at if isinstance(self.raw, LocatedList) else []
        for i, item in enumerate(self.raw):
            yield self._at(f"{self.path}[{i}]", item, marks[i] if i < len(marks) else None)

    def convert(self, parse: Callable[[Any], T]) -> T:
        """parse(raw), its ValueError an error naming this field."""
        try:
            return parse(self.raw)
        except ValueError as exc:
            self.fail(str(exc))


def kind(value: Any) -> str:
    """What a YAML value is, for "expected X, got Y"."""
    return fields.WRITTEN.kind(value)


def read(cls: type[T], value: Value, **extra: Any) -> T:
    """An instance of the schema dataclass cls from the mapping in value.

    A null value means all defaults; extra sets fields that are not YAML keys.
    """
    raw = {} if value.raw is None else value.mapping()
    known = keys(cls)
    for name in raw:
        if name not in known:
            value.key_of(name).fail(f"unknown key; expected one of: {', '.join(known)}")
    kwargs = dict(extra)
    for name, (f, meta) in known.items():
        child = value.child(name)
        if child.raw is not None:
            kwargs[f.name] = meta.convert(child)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            child.fail(f"is required ({meta.doc})")
    try:
        return cls(**kwargs)
    except FieldError as exc:
        yaml_name = next((n for n, (f, _) in known.items() if f.name == exc.field), "")
        (value.child(yaml_name) if yaml_name else value).fail(str(exc))


# ---------------------------------------------------------------------------------- converters


def section(cls: type[T]) -> Callable[[Value], T]:
    """A nested mapping read as the schema dataclass cls."""
    return lambda value: read(cls, value)


def string(value: Value) -> str:
    value.check(fields.nonempty_text(value.raw))
    return value.raw


def name(value: Value) -> str:
    text = string(value)
    if not _NAME_RE.fullmatch(text):
        value.fail(
            f"expected 1-128 characters of letters, digits, '_', '.', ':' or '-', got {text!r}"
        )
    return text


def abspath(value: Value) -> Path:
    text = string(value)
    try:
        path = Path(text).expanduser()
    except RuntimeError:  # ~user of a user this host does not have
        value.fail(f"expected an absolute path, got {text!r} (no such home directory)")
    if not path.is_absolute():
        value.fail(f"expected an absolute path, got {text!r}")
    return path


def existing_file(value: Value) -> str:
    """A file that exists.

    A relative path is relative to the YAML file, as exporter-toolkit reads its paths.
    """
    path = Path(string(value))
    if not path.is_absolute() and value.base is not None:
        path = value.base / path
    if not path.is_file():
        value.fail(f"no such file {str(path)!r}")
    return str(path)


def regex(value: Value) -> re.Pattern[str]:
    text = string(value)
    try:
        return re.compile(text)
    except re.error as exc:
        value.fail(f"invalid regular expression {text!r}: {exc}")


def boolean(value: Value) -> bool:
    value.check(fields.boolean(value.raw, fields.WRITTEN))
    return value.raw


def duration(value: Value) -> float:
    """Seconds, in the one duration grammar (:func:`trainguard.shared.units.parse_duration`)."""
    return value.convert(units.parse_duration)


def size(value: Value) -> int:
    """Bytes, in the one size grammar (:func:`trainguard.shared.units.parse_size`)."""
    return value.convert(units.parse_size)


def integer(lo: int, hi: int) -> Convert:
    def convert(value: Value) -> int:
        value.check(fields.integer(value.raw, lo, hi, fields.WRITTEN))
        return value.raw

    return convert


def choice(options: Mapping[str, Any] | tuple[str, ...]) -> Convert:
    """One of the names in options, as written."""

    def convert(value: Value) -> str:
        value.check(fields.choice(value.raw, options, fields.WRITTEN))
        return str(value.raw)

    return convert


def checked(convert: Convert, problem: Callable[[Any], str | None]) -> Convert:
    """convert, then problem(result): a message when the result is not acceptable."""

    def check(value: Value) -> Any:
        result = convert(value)
        message = problem(result)
        if message:
            value.fail(message)
        return result

    return check


def refused(message: str) -> Convert:
    """A key that is known (so not a typo) but not supported: any value is an error."""

    def refuse(value: Value) -> NoReturn:
        value.fail(message)

    return refuse


def list_of(convert: Convert, *, unique: str | None = None) -> Convert:
    """A list, each item converted; ``unique``: an attribute no two items may share."""

    def convert_list(value: Value) -> tuple[Any, ...]:
        out: list[Any] = []
        first: dict[Any, str] = {}
        for item in value.items():
            result = convert(item)
            if unique is not None:
                seen = getattr(result, unique)
                if seen in first:
                    item.child(unique).fail(f"duplicate {unique} {seen!r} (also {first[seen]})")
                first[seen] = item.path
            out.append(result)
        return tuple(out)

    return convert_list


def mapping_of(
    key_problem: Callable[[Any], str | None], convert: Convert, what: str = "a mapping"
) -> Convert:
    """A mapping of names to values: key_problem(key) is a message for a bad key."""

    def convert_mapping(value: Value) -> dict[Any, Any]:
        out = {}
        for k in value.mapping(what):
            message = key_problem(k)
            if message:
                value.key_of(k).fail(message)
            child = value.child(k)
            if child.raw is None:
                child.fail(f"expected a value, got {kind(None)}")
            out[k] = convert(child)
        return out

    return convert_mapping


def plain_name(k: Any) -> str | None:
    """A problem with a mapping key that names something (letters, digits, _ . : -)."""
    if isinstance(k, str) and _NAME_RE.fullmatch(k):
        return None
    return f"expected a name of letters, digits, '_', '.', ':' or '-', got {k!r}"
