"""The heartbeat's ``nonfinite`` record: counted on observed steps, written, read back, and every
bad field refused with its name."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from trainguard.run.scalar_health import ScalarHealth
from trainguard.shared.heartbeat.read import read_heartbeat
from trainguard.shared.heartbeat.record import Heartbeat, HeartbeatError, write_heartbeat
from trainguard.shared.nonfinite import MAX_NONFINITE_NAMES, NonFinite


def heartbeat(**over: Any) -> Heartbeat:
    fields: dict[str, Any] = dict(
        run="llama-ft",
        rank=0,
        pid=4242,
        create_time=1_700_000_000.0,
        host="gpu-box",
        started=1_700_000_001.0,
        time=1_700_000_100.0,
        step=10,
        scalars={"loss": 2.5},
    )
    fields.update(over)
    return Heartbeat(**fields)


def test_counts_observed_steps_once_each() -> None:
    health = ScalarHealth()
    steps = [
        (1, {"loss": 2.0, "grad_norm": 1.0}),
        (2, {"loss": math.nan, "grad_norm": math.inf}),
        (3, {"loss": -math.inf, "grad_norm": 1.0}),
        (4, {"grad_norm": 1.0}),  # no loss: the streak stays
        (5, {"loss": math.nan}),
    ]
    for step, scalars in steps:
        record = (step, 0.0, scalars)
        health.observe(record, scalars)
        health.observe(record, scalars)  # a keepalive rewrite of the same step: not again
    assert health.state() == NonFinite(counts={"loss": 3, "grad_norm": 1}, loss_streak=3)
    finite = {"loss": 1.5}
    health.observe((6, 0.0, finite), finite)
    assert health.state() == NonFinite(counts={"loss": 3, "grad_norm": 1}, loss_streak=0)


def test_names_beyond_the_limit_are_not_counted() -> None:
    health = ScalarHealth()
    for i in range(MAX_NONFINITE_NAMES + 5):
        scalars = {f"s{i}": math.nan}
        health.observe(object(), scalars)
    counts = health.state().counts
    assert len(counts) == MAX_NONFINITE_NAMES and set(counts.values()) == {1}


def test_round_trips_and_is_optional(tmp_path: Path) -> None:
    path = tmp_path / "x.heartbeat.json"
    hb = heartbeat(nonfinite=NonFinite(counts={"loss": 7, "lr": 0}, loss_streak=4))
    write_heartbeat(path, hb)
    assert read_heartbeat(path, check_name=False) == hb
    older = heartbeat()
    write_heartbeat(path, older)
    assert "nonfinite" not in json.loads(path.read_text())
    assert read_heartbeat(path, check_name=False).nonfinite is None


@pytest.mark.parametrize(
    ("bad", "field", "message"),
    [
        ([], "nonfinite", "expected an object"),
        ({"counts": []}, "nonfinite.counts", "expected an object"),
        ({"counts": {"bad name": 1}}, "nonfinite.counts", "letters, digits"),
        ({"counts": {"loss": -1}}, "nonfinite.counts.loss", "integer >= 0"),
        ({"counts": {"loss": 1.5}}, "nonfinite.counts.loss", "integer >= 0"),
        ({"counts": {"loss": True}}, "nonfinite.counts.loss", "integer >= 0"),
        ({"counts": {f"s{i}": 0 for i in range(33)}}, "nonfinite.counts", "at most 32"),
        ({"loss_streak": -1}, "nonfinite.loss_streak", "expected an integer in 0.."),
        ({"loss_streak": "3"}, "nonfinite.loss_streak", "expected an integer"),
    ],
)
def test_each_bad_field_is_named(tmp_path: Path, bad: Any, field: str, message: str) -> None:
    path = tmp_path / "x.heartbeat.json"
    path.write_text(json.dumps({**heartbeat().to_dict(), "nonfinite": bad}))
    with pytest.raises(HeartbeatError) as err:
        read_heartbeat(path, check_name=False)
    text = str(err.value)
    assert text.startswith(f"{path}: field '{field}': "), text
    assert message in text, text
