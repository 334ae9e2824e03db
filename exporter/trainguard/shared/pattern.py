"""Which names in a checkpoint directory are checkpoints, and of which step: the one rule the
library writing them and the exporter judging them share."""

from __future__ import annotations

import re

DEFAULT_CHECKPOINT_PATTERN = "step_{step}"
PARTIAL_SUFFIX = ".part"
_NOT_PLAIN = re.compile(r"[/\\:\x00-\x1f\x7f]")


def checkpoint_pattern_problem(pattern: str) -> str | None:
    """Why a checkpoint name pattern cannot be used, or None. Hidden names are the temporaries
    of many tools (and the ``.trainguard`` manifest directory), ``.part`` marks a file still
    being written: a pattern matching either would call them checkpoints."""
    if pattern.count("{step}") != 1 or "/" in pattern or "\\" in pattern:
        return f"expected a file name containing '{{step}}' once, got {pattern!r}"
    if pattern.startswith(".") or pattern.endswith(".part"):
        return f"expected a name not starting with '.' nor ending with '.part', got {pattern!r}"
    return None


def is_plain_name(name: str) -> bool:
    """A name that can only mean a file directly inside the directory it is looked up in
    (no separators, no parent, not hidden, no control characters)."""
    # separators, ':' (drive-relative names and NTFS streams on Windows), control characters
    return 0 < len(name) <= 255 and not name.startswith(".") and _NOT_PLAIN.search(name) is None


#: the temporary names frameworks give a step directory while they write it: trainguard's own
#: ``<name>.part``, Orbax's ``<name>.orbax-checkpoint-tmp-<timestamp>``, and the Hugging Face
#: Trainer's ``tmp-<name>`` (some 4.3x releases)
_TEMP_DIR_RE = re.compile(r"(?:tmp-)?(.+?)(?:\.part|\.orbax-checkpoint-tmp(?:-[0-9]+)?)?", re.ASCII)


class CheckpointPattern:
    """Which names are checkpoints: the configured pattern (``step_{step}``) with any
    extension or none (``step_100.pt``, ``step_0100.safetensors``, ``step_100``) for regular
    files, and exactly the pattern (``checkpoint-500``, ``iter_0000500``) for a directory per
    step. ``<checkpoint>.part`` is a checkpoint being written, and so is a step directory under
    a framework's temporary name (:meth:`temp_dir_step`)."""

    def __init__(self, pattern: str = DEFAULT_CHECKPOINT_PATTERN) -> None:
        problem = checkpoint_pattern_problem(pattern)
        if problem:
            raise ValueError(f"checkpoint pattern: {problem}")
        self.pattern = pattern
        prefix, suffix = pattern.split("{step}")
        self._re = re.compile(
            rf"{re.escape(prefix)}([0-9]{{1,18}}){re.escape(suffix)}(?:\.[^/\\]*)?", re.ASCII
        )
        self._dir_re = re.compile(
            rf"{re.escape(prefix)}([0-9]{{1,18}}){re.escape(suffix)}", re.ASCII
        )

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
        """The step of a step directory's final name (the pattern exactly, no extension), else
        None."""
        m = self._dir_re.fullmatch(name)
        if m is None or not is_plain_name(name):
            return None
        return int(m.group(1))

    def temp_dir_step(self, name: str) -> int | None:
        """The step of a step directory under a temporary name (``step-500.part``,
        ``500.orbax-checkpoint-tmp-1700000000``, ``tmp-checkpoint-500``), else None."""
        m = _TEMP_DIR_RE.fullmatch(name)
        if m is None or m.group(1) == name:
            return None
        return self.dir_step(m.group(1))
