"""Which names in a checkpoint directory are checkpoints, and of which step.

The one rule the library writing them and the exporter judging them share.

The grammar (docs/checkpoints.md#checkpoint-names): a file name in which ``{step}`` stands
once for the step (decimal digits), ``{name}`` for any other value (an epoch, a metric:
``epoch={epoch}-step={step}.ckpt`` names ``epoch=0-step=3.ckpt`` and
``val_loss=0.12-step=40.ckpt`` fits ``{a}-step={step}.ckpt``), ``*`` for any run of
characters, ``{{`` and ``}}`` for a literal brace; everything else is literal. A format spec
is allowed and ignored (``{step:05d}``, ``{val_loss:.2f}``, as in Lightning's file names).
Frameworks name files by several values, but only the step orders checkpoints, so only the
step is read.
"""

from __future__ import annotations

import re
from typing import NamedTuple

DEFAULT_CHECKPOINT_PATTERN = "step_{step}"
PARTIAL_SUFFIX = ".part"
_NOT_PLAIN = re.compile(r"[/\\:\x00-\x1f\x7f]")

#: one token of a pattern: an escaped brace, a field, a wildcard, or a run of literal text
_TOKEN = re.compile(
    r"(\{\{|\}\})|\{([A-Za-z_][A-Za-z0-9_.]*)(?::[^{}]*)?\}|(\*)|([^{}*]+)|(.)", re.DOTALL
)
_STEP_RE = "([0-9]{1,18})"
_VALUE_RE = r"[^/\\]+?"  # a field: at least one character, as few as fit
_ANY_RE = r"[^/\\]*?"  # a wildcard: any run, empty too


class _Parsed(NamedTuple):
    regex: str  # the name, the step as group 1
    problem: str | None


def _parse(pattern: str) -> _Parsed:
    """The regular expression of a pattern, or why it has none."""
    parts: list[str] = []
    kinds: list[str] = []  # "lit", "step", "field" per part, to see what touches the step
    steps = 0
    for m in _TOKEN.finditer(pattern):
        brace, field, star, literal, bad = m.groups()
        if bad is not None:
            return _Parsed(
                "",
                f"unexpected {bad!r} at character {m.start() + 1} of {pattern!r} "
                "(a field is {name}, a literal brace {{ or }})",
            )
        if brace is not None or literal is not None:
            parts.append(re.escape(brace[0] if brace is not None else literal))
            kinds.append("lit")
        elif star is not None:
            parts.append(_ANY_RE)
            kinds.append("field")
        elif field == "step":
            parts.append(_STEP_RE)
            kinds.append("step")
            steps += 1
        else:
            parts.append(_VALUE_RE)
            kinds.append("field")
    if steps != 1:
        return _Parsed("", f"expected a file name containing '{{step}}' once, got {pattern!r}")
    at = kinds.index("step")
    if (at > 0 and kinds[at - 1] == "field") or (at + 1 < len(kinds) and kinds[at + 1] == "field"):
        return _Parsed(
            "",
            f"'{{step}}' must be set apart from other fields and '*' by literal text in "
            f"{pattern!r}, else its digits cannot be told from theirs",
        )
    return _Parsed("".join(parts), None)


def checkpoint_pattern_problem(pattern: str) -> str | None:
    """Why a checkpoint name pattern cannot be used, or None.

    Hidden names are the temporaries of many tools (and the ``.trainguard`` manifest directory),
    ``.part`` marks a file still being written: a pattern matching either would call them
    checkpoints.
    """
    if "/" in pattern or "\\" in pattern:
        return f"expected a file name, not a path, got {pattern!r}"
    if pattern.startswith(".") or pattern.endswith(".part"):
        return f"expected a name not starting with '.' nor ending with '.part', got {pattern!r}"
    return _parse(pattern).problem


def is_plain_name(name: str) -> bool:
    """Whether ``name`` can only mean a file directly inside the directory it is looked up in.

    No separators, no parent, not hidden, no control characters.
    """
    # separators, ':' (drive-relative names and NTFS streams on Windows), control characters
    return 0 < len(name) <= 255 and not name.startswith(".") and _NOT_PLAIN.search(name) is None


#: the temporary names frameworks give a step directory while they write it: trainguard's own
#: ``<name>.part``, Orbax's ``<name>.orbax-checkpoint-tmp-<timestamp>``, and the Hugging Face
#: Trainer's ``tmp-<name>`` (some 4.3x releases)
_TEMP_DIR_RE = re.compile(r"(?:tmp-)?(.+?)(?:\.part|\.orbax-checkpoint-tmp(?:-[0-9]+)?)?", re.ASCII)


class CheckpointPattern:
    """Which names are checkpoints, and of which step, by the configured pattern.

    The pattern (``step_{step}``, ``epoch={epoch}-step={step}.ckpt``) with any extension or none
    (``step_100.pt``, ``step_0100.safetensors``, ``step_100``) for regular files, and exactly the
    pattern (``checkpoint-500``, ``iter_0000500``) for a directory per step. ``<checkpoint>.part``
    is a checkpoint being written, and so is a step directory under a framework's temporary name
    (:meth:`temp_dir_step`), which a wildcard never turns into a final one.
    """

    def __init__(self, pattern: str = DEFAULT_CHECKPOINT_PATTERN) -> None:
        problem = checkpoint_pattern_problem(pattern)
        if problem:
            raise ValueError(f"checkpoint pattern: {problem}")
        self.pattern = pattern
        regex = _parse(pattern).regex
        self._re = re.compile(rf"{regex}(?:\.[^/\\]*)?", re.ASCII | re.DOTALL)
        self._dir_re = re.compile(regex, re.ASCII | re.DOTALL)

    def __repr__(self) -> str:
        return f"CheckpointPattern({self.pattern!r})"

    def step(self, name: str) -> int | None:
        """The step of a finished checkpoint's name, else None."""
        m = self._re.fullmatch(name)  # first: cheap, and rejects nearly every other name
        if m is None or name.endswith(PARTIAL_SUFFIX) or not is_plain_name(name):
            return None
        return int(m.group(1))

    def partial_step(self, name: str) -> int | None:
        """The step of a ``.part`` file being written under this pattern, else None."""
        if not name.endswith(PARTIAL_SUFFIX):
            return None
        return self.step(name[: -len(PARTIAL_SUFFIX)])

    def dir_step(self, name: str) -> int | None:
        """The step of a step directory's final name (the pattern exactly), else None.

        No extension, and never a temporary name (``tmp-checkpoint-500`` under ``*-{step}``).
        """
        step = self._final_dir_step(name)
        if step is None or self.temp_dir_step(name) is not None:
            return None
        return step

    def _final_dir_step(self, name: str) -> int | None:
        m = self._dir_re.fullmatch(name)
        if m is None or name.endswith(PARTIAL_SUFFIX) or not is_plain_name(name):
            return None
        return int(m.group(1))

    def temp_dir_step(self, name: str) -> int | None:
        """The step of a step directory under a temporary name, else None.

        Such as ``step-500.part``, ``500.orbax-checkpoint-tmp-1700000000`` or
        ``tmp-checkpoint-500``.
        """
        m = _TEMP_DIR_RE.fullmatch(name)
        if m is None or m.group(1) == name:
            return None
        return self._final_dir_step(m.group(1))
