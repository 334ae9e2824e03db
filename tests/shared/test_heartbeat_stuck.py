"""The heartbeat's ``stuck`` field: written only when set, read back, and checked like the rest."""

from __future__ import annotations

from typing import Any

import pytest

from trainguard.shared.heartbeat.read import parse_heartbeat
from trainguard.shared.heartbeat.record import Heartbeat, HeartbeatError, Stuck


def heartbeat(stuck: Stuck | None) -> Heartbeat:
    return Heartbeat(
        run="job",
        rank=17,
        pid=4242,
        create_time=1_700_000_000.0,
        host="node-3",
        started=1_700_000_001.0,
        time=1_700_000_100.0,
        stuck=stuck,
    )


def test_round_trip() -> None:
    stuck = Stuck(1_700_000_090.0, "_BaseDataLoaderIter.__next__ <- train.py:88 load_batch", None)
    doc = heartbeat(stuck).to_dict()
    assert doc["stuck"] == {"since": 1_700_000_090.0, "where": stuck.where, "collective": None}
    assert parse_heartbeat(doc).stuck == stuck
    waiting = Stuck(1_700_000_090.0, "all_reduce <- train.py:40 step", "all_reduce")
    assert parse_heartbeat(heartbeat(waiting).to_dict()).stuck == waiting


def test_absent_when_not_stuck() -> None:
    doc = heartbeat(None).to_dict()
    assert "stuck" not in doc  # older readers see the heartbeat they always saw
    assert parse_heartbeat(doc).stuck is None


@pytest.mark.parametrize(
    ("stuck", "field", "message"),
    [
        ("train.py:1", "stuck", "expected an object"),
        ({"where": "x"}, "stuck.since", "missing"),
        ({"since": 1.0}, "stuck.where", "missing"),
        ({"since": -1, "where": "x"}, "stuck.since", "seconds since the epoch"),
        ({"since": 1.0, "where": "a\x1b[2Jb"}, "stuck.where", "control characters"),
        ({"since": 1.0, "where": "x" * 257}, "stuck.where", "at most 256"),
        ({"since": 1.0, "where": "x", "collective": 3}, "stuck.collective", "a string"),
        ({"since": 1.0, "where": "x", "collective": "all reduce"}, "stuck.collective", "name"),
    ],
)
def test_bad_values_name_the_field(stuck: Any, field: str, message: str) -> None:
    doc = heartbeat(None).to_dict()
    doc["stuck"] = stuck
    with pytest.raises(HeartbeatError, match=f"field '{field}'.*{message}"):
        parse_heartbeat(doc, "hb.json")
