"""The heartbeat's signal fields: written so that older readers keep the file, read back whole.

A death by a signal is written as an ``exception`` with ``signal`` (older format-1 readers
refuse a cause they do not know, and with it the whole file); the process's own ``signal``,
``exit_cause`` and ``last_signal`` are optional fields an older reader ignores.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainguard.shared.heartbeat.read import read_heartbeat
from trainguard.shared.heartbeat.record import Death, Heartbeat, HeartbeatError, write_heartbeat

#: the causes format-1 readers before signals accept
OLD_CAUSES = ("reboot", "oom_killer", "exception", "unknown")


def heartbeat(**over: object) -> Heartbeat:
    fields: dict[str, object] = dict(
        run="sig", rank=0, pid=42, create_time=1e9, host="h", started=1e9, time=1e9 + 1
    )
    fields.update(over)
    return Heartbeat(**fields)  # type: ignore[arg-type]


def test_signal_deaths_read_as_exceptions_to_older_readers(tmp_path: Path) -> None:
    hb = heartbeat(
        state="failed",
        signal="SIGTERM",
        exit_cause="time_limit",
        last_signal="SIGUSR1",
        last_signal_time=1e9 + 0.5,
        death_history=(
            Death(step=3, time=1e9, detected=1e9 + 1, cause="signal", signal="SIGTERM"),
            Death(step=4, time=1e9, detected=1e9 + 2, cause="time_limit", signal="SIGTERM"),
            Death(step=5, time=1e9, detected=1e9 + 3, cause="exception"),
            Death(step=6, time=1e9, detected=1e9 + 4, cause="gpu_xid", xid=79),
        ),
    )
    path = tmp_path / hb.filename
    write_heartbeat(path, hb)
    written = json.loads(path.read_text())
    assert all(d["cause"] in OLD_CAUSES for d in written["death_history"])
    assert written["death_history"][0] == {
        "step": 3,
        "time": 1e9,
        "detected": 1e9 + 1,
        "cause": "exception",
        "xid": None,
        "signal": "SIGTERM",
    }
    assert written["death_history"][1]["time_limit"] is True
    assert "signal" not in written["death_history"][2]
    assert read_heartbeat(path) == hb


def test_a_heartbeat_without_signals_writes_none_of_their_fields(tmp_path: Path) -> None:
    hb = heartbeat()
    path = tmp_path / hb.filename
    write_heartbeat(path, hb)
    written = json.loads(path.read_text())
    assert not {"signal", "exit_cause", "last_signal", "last_signal_time"} & set(written)
    assert read_heartbeat(path) == hb


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"signal": "TERM"}, "signal"),
        ({"signal": 15}, "signal"),
        ({"exit_cause": "preempted"}, "exit_cause"),
        ({"last_signal": "sigusr1"}, "last_signal"),
        ({"last_signal_time": -1}, "last_signal_time"),
        (
            {"death_history": [{"time": 1, "detected": 2, "cause": "exception", "signal": "x"}]},
            "death_history[0].signal",
        ),
        (
            {"death_history": [{"time": 1, "detected": 2, "cause": "exception", "time_limit": 1}]},
            "death_history[0].time_limit",
        ),
    ],
)
def test_each_bad_signal_field_is_named(
    tmp_path: Path, change: dict[str, object], field: str
) -> None:
    hb = heartbeat()
    path = tmp_path / hb.filename
    write_heartbeat(path, {**hb.to_dict(), **change})
    with pytest.raises(HeartbeatError) as err:
        read_heartbeat(path)
    assert f"field '{field}'" in str(err.value)
