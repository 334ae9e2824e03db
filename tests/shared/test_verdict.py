"""One rule for judging a file, whether it is a checkpoint of its own or a file of a step
directory (``trainguard.shared.verdict.judged``, which both ``judge`` and ``judge_dirs`` use)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from trainguard.shared.stepdir import Entry
from trainguard.shared.verdict import judged

GRACE_NS = 60 * 10**9


def entry(path: Path, size: int, age_s: float | None) -> Entry:
    path.write_bytes(b"x" * size)
    if age_s is None:
        os.utime(path, ns=(0, 0))  # an mtime of 0: unknown
    else:
        old = time.time_ns() - int(age_s * 1e9)
        os.utime(path, ns=(old, old))
    return Entry(path.name, 100, os.lstat(path))


@pytest.mark.parametrize(
    ("size", "age_s", "expected", "trust", "vouched", "complete"),
    [
        (10, 3600, 10, False, False, True),  # the recorded size
        (9, 3600, 10, False, False, False),  # shorter: truncated
        (10, None, 10, False, False, False),  # unknown mtime: never complete
        (10, 3600, None, False, False, False),  # no size, no trust: not complete
        (10, 3600, None, True, False, True),  # trusted once settled
        (10, 5, None, True, False, False),  # ... not before
        (0, 3600, None, True, False, False),  # an empty file is never trusted
        (0, 5, None, False, True, True),  # a settled committed directory vouches for its files
    ],
)
def test_one_rule_for_a_file(
    tmp_path: Path,
    size: int,
    age_s: float | None,
    expected: int | None,
    trust: bool,
    vouched: bool,
    complete: bool,
) -> None:
    e = entry(tmp_path / "step_100.pt", size, age_s)
    j = judged(e, expected, None, time.time_ns(), GRACE_NS, trust, vouched)
    assert j.complete is complete
    assert j.truncated is (
        expected is not None and age_s is not None and age_s > 60 and size < expected
    )
