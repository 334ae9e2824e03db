"""The optional ``starting`` field: written only when true, read as false when absent, and a
value of another type refused with the field named (docs/heartbeat.md#starting)."""

from __future__ import annotations

import json

import pytest

from trainguard.shared.heartbeat.read import parse_heartbeat
from trainguard.shared.heartbeat.record import Heartbeat, HeartbeatError

BASE = Heartbeat(run="r", rank=0, pid=42, create_time=1.0, host="h", started=2.0, time=3.0)


def test_starting_is_written_only_when_true_and_read_back() -> None:
    assert "starting" not in BASE.to_dict()  # a training heartbeat, as older reporters wrote
    assert parse_heartbeat(BASE.to_dict()).starting is False
    doc = Heartbeat(**{**vars(BASE), "starting": True}).to_dict()
    assert doc["starting"] is True
    assert parse_heartbeat(json.loads(json.dumps(doc))).starting is True


@pytest.mark.parametrize("bad", [1, "true", [], {}])
def test_a_starting_that_is_not_a_boolean_is_refused_by_name(bad: object) -> None:
    doc = {**BASE.to_dict(), "starting": bad}
    with pytest.raises(HeartbeatError, match="field 'starting': expected true or false"):
        parse_heartbeat(doc)
