"""The one field validator: a document's values read by path, each checked, each error naming it.

Two kinds of document are read field by field: a heartbeat (JSON that anyone may write,
:mod:`trainguard.shared.heartbeat.fields`) and trainguard's YAML files (hand-written: the
exporter's :mod:`trainguard.exporter.config.schema`). What must never be wrong is written here once,
for both: a boolean is never an integer; an integer too large for a float is refused, not
raised on; a number is finite and in its range; a text is bounded and free of control
characters; a mapping or list is bounded; a null counts as not given; a field's path is written
one way (``runs[2].checkpoints.mirrors.backup``); and a failure raises the document's own error
naming that path (:meth:`Node.fail`). What differs is only how a problem is worded, which a
:class:`Dialect` says: a heartbeat's names JSON's kinds and never quotes a string from the file
(a hard link to a private file must not leak it into a log), a YAML file's names YAML's kinds
and shows the value as the operator wrote it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from typing import Any, NoReturn

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


# ------------------------------------------------------------------------------ the predicates


def is_integer(value: Any) -> bool:
    """An integer and not a boolean (in Python a bool is an int; in a document it is not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An integer or a float, not a boolean."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def as_float(value: float) -> float | None:
    """The number as a float, None for an integer too large for one (JSON allows any size)."""
    try:
        return float(value)
    except OverflowError:
        return None


def short_int(value: int) -> str:
    """An integer as an error shows it: a huge one by its size, not its thousands of digits."""
    return str(value) if abs(value) < 10**30 else f"a {value.bit_length()}-bit number"


def text_problem(value: str) -> str | None:
    """What is wrong with a text for a label or a log line (control characters, surrogates)."""
    if _CONTROL.search(value):
        return "contains control characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains an unpaired surrogate (not encodable as UTF-8)"
    return None


# --------------------------------------------------------------------------------- the wording


class Dialect:
    """How one kind of document words a problem; the checks are the same for every kind.

    This one is JSON's, for a file that anyone may write: kinds as JSON calls them, and an error
    shows a number that is out of range but never a string from the file.
    """

    null = "null"
    kinds: Mapping[type, str] = {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
    }

    def kind(self, value: Any) -> str:
        """What a value is, for "expected X, got Y"."""
        if value is None:
            return self.null
        name = self.kinds.get(type(value))
        if name is not None:
            return name
        for t in (bool, *self.kinds):  # subclasses (a YAML mapping that knows its lines)
            if isinstance(value, t):
                return self.kinds[t]
        return f"a {type(value).__name__}"

    def expected(self, what: str, value: Any) -> str:
        """A value of the wrong kind."""
        return f"expected {what}, got {self.kind(value)}"

    def number(self, what: str, lo: Any, hi: Any, value: Any, right_kind: bool) -> str:
        """A number of the wrong kind or out of lo..hi."""
        if not right_kind:
            return self.expected(what, value)
        shown = short_int(value) if isinstance(value, int) else repr(value)
        return f"expected {what} in {lo}..{hi}, got {shown}"

    def boolean(self, value: Any) -> str:
        return self.expected("true or false", value)

    def choice(self, choices: Collection[str], value: Any) -> str:
        return f"expected one of {', '.join(choices)}"


class WrittenDialect(Dialect):
    """The wording for a file its operator wrote (YAML): YAML's kinds, the value as written."""

    null = "nothing"
    kinds: Mapping[type, str] = {**Dialect.kinds, dict: "a mapping"}

    def number(self, what: str, lo: Any, hi: Any, value: Any, right_kind: bool) -> str:
        return f"expected {what} {lo}-{hi}, got {value!r}"

    def boolean(self, value: Any) -> str:
        return f"expected true or false, got {value!r}"

    def choice(self, choices: Collection[str], value: Any) -> str:
        return f"expected one of {', '.join(choices)}, got {value!r}"


UNTRUSTED = Dialect()
WRITTEN = WrittenDialect()


# ---------------------------------------------------------------------------------- the checks
# Each returns what is wrong with a value (worded by the dialect), or None when it is fine.


def integer(value: Any, lo: int, hi: int, d: Dialect = UNTRUSTED) -> str | None:
    """An integer in lo..hi."""
    if type(value) is int or is_integer(value):  # the exact type first: no call (a hot path)
        if lo <= value <= hi:
            return None
        return d.number("an integer", lo, hi, value, True)
    return d.number("an integer", lo, hi, value, False)


def number(
    value: Any, lo: float, hi: float, what: str, d: Dialect = UNTRUSTED, *, kind: str = ""
) -> str | None:
    """A finite number in lo..hi (an integer of any size is refused, not raised on).

    ``kind`` names what is expected when the value is not a number (default: ``what``).
    """
    if type(value) is float:  # the common case: no call, no overflow possible
        if lo <= value <= hi:  # False for NaN; infinities are out of any finite range
            return None
    elif not is_number(value):
        return d.expected(kind or what, value)
    else:
        f = as_float(value)
        if f is not None and math.isfinite(f) and lo <= f <= hi:
            return None
    return d.number(what, f"{lo:.0f}", f"{hi:.0f}", value, True)


def text(
    value: Any, limit: int, d: Dialect = UNTRUSTED, *, what: str = "a string", raw: bool = False
) -> str | None:
    """A string of at most limit characters without control characters (any, if ``raw``)."""
    if not isinstance(value, str):
        return d.expected(what, value)
    if len(value) > limit:
        return f"expected at most {limit} characters, got {len(value)}"
    return None if raw else text_problem(value)


def nonempty_text(value: Any, d: Dialect = WRITTEN) -> str | None:
    """A string that is not empty (a hand-written name, path or pattern)."""
    if not isinstance(value, str) or not value:
        return d.expected("a non-empty string", value)
    return None


def boolean(value: Any, d: Dialect = UNTRUSTED) -> str | None:
    """A boolean: true or false."""
    return None if isinstance(value, bool) else d.boolean(value)


def choice(value: Any, choices: Collection[str], d: Dialect = UNTRUSTED) -> str | None:
    """One of the names in choices, as written."""
    if isinstance(value, str) and value in choices:
        return None
    return d.choice(choices, value)


def mapping(value: Any, limit: int | None, d: Dialect, what: str = "") -> str | None:
    """A mapping of at most limit entries (None: any number)."""
    if not isinstance(value, dict):
        return d.expected(what or d.kinds[dict], value)
    if limit is not None and len(value) > limit:
        return _too_many(value, limit)
    return None


def sequence(value: Any, limit: int | None, d: Dialect) -> str | None:
    """A list of at most limit items (None: any number)."""
    if not isinstance(value, list):
        return d.expected("a list", value)
    if limit is not None and len(value) > limit:
        return _too_many(value, limit)
    return None


def _too_many(value: Collection[Any], limit: int) -> str:
    return f"expected at most {limit} entries, got {len(value)}"


# ------------------------------------------------------------------------------------ the node


def join(path: str, key: Any) -> str:
    """The path of a mapping's key ``key`` under ``path`` (``runs[2].name``)."""
    return f"{path}.{key}" if path else str(key)


class Node:
    """One value of a document with its path; :meth:`fail` raises the document's own error.

    A subclass says what that error is (:meth:`error`) and how a problem is worded
    (``dialect``); the checks above say what is wrong.
    """

    __slots__ = ("path", "raw")
    dialect: Dialect = UNTRUSTED

    def __init__(self, raw: Any, path: str = "") -> None:
        self.raw = raw
        self.path = path

    def error(self, path: str, message: str) -> Exception:
        """The document's error for a problem with the value at path."""
        raise NotImplementedError

    def fail(self, message: str) -> NoReturn:
        """Raise the document's error naming this value's path."""
        raise self.error(self.path, message)

    def fail_at(self, key: Any, message: str) -> NoReturn:
        """Raise the document's error naming the path of key (``name``, ``runs[2].name``) here."""
        raise self.error(join(self.path, key), message)

    def check(self, problem: str | None) -> None:
        """Fail with problem if there is one (what a check above returned)."""
        if problem:
            self.fail(problem)

    def check_at(self, key: Any, problem: str | None) -> None:
        """Fail at key with problem if there is one."""
        if problem:
            self.fail_at(key, problem)
