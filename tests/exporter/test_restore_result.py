"""A restore drill's result file is read as untrusted, by the one field validator: every bad field
is a ResultError naming the file and the field, never a crash, never a quoted string."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainguard.exporter.collectors.restore.result import (
    Result,
    ResultError,
    read_result,
    write_result,
)

GOOD = Result(
    path="/data/ckpt",
    run="llama",
    location="primary",
    time=1_700_000_000.0,
    ok=True,
    reason="loaded step 10",
    checkpoint="step_10.pt",
    step=10,
    verified_step=10,
    verified_time=1_700_000_000.0,
    verified_checkpoint="step_10.pt",
)


def test_a_good_result_round_trips(tmp_path: Path) -> None:
    assert read_result(write_result(tmp_path, GOOD)) == GOOD


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"format": "SECRET"}, "format", "expected an integer, got a string"),
        ({"step": "SECRET"}, "step", "expected an integer, got a string"),
        ({"step": -1}, "step", "expected an integer in 0..9223372036854775807, got -1"),
        ({"time": 10**400}, "time", "got a 1329-bit number"),  # was an OverflowError
        ({"time": 0}, "time", "expected seconds since the epoch in 0.."),
        ({"time": "SECRET"}, "time", "expected seconds since the epoch, got a string"),
        ({"ok": "SECRET"}, "ok", "expected true or false, got a string"),
        ({"run": "x" * 600}, "run", "expected at most 512 characters, got 600"),
        ({"checkpoint": "a\x00b"}, "checkpoint", "contains control characters"),
    ],
)
def test_a_bad_field_is_named_and_never_quoted(
    tmp_path: Path, change: dict[str, Any], field: str, message: str
) -> None:
    path = write_result(tmp_path, GOOD)
    doc = json.loads(path.read_text())
    doc.update(change)
    path.write_text(json.dumps(doc))
    with pytest.raises(ResultError) as err:
        read_result(path)
    text = str(err.value)
    assert text.startswith(f"{path}: field '{field}': "), text
    assert message in text and "SECRET" not in text, text


def test_a_reason_keeps_its_line_ends(tmp_path: Path) -> None:
    path = write_result(tmp_path, GOOD.__class__(**{**GOOD.__dict__, "reason": "a\n\tb"}))
    assert read_result(path).reason == "a\n\tb"
