"""Coverage-guided fuzzing (atheris/libFuzzer) of the heartbeat reader: any bytes a stranger
can put in the state dir give a Heartbeat or a HeartbeatError, nothing else, and whatever is
accepted writes and reads back. See README.md in this directory for how to run it."""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile

import _common  # noqa: F401  (sys.path for this checkout)
import atheris

with atheris.instrument_imports():
    from trainguard.shared.heartbeat.read import (
        parse_heartbeat,
        parse_heartbeat_bytes,
        read_heartbeat,
    )
    from trainguard.shared.heartbeat.record import HeartbeatError

_TMP = tempfile.mkdtemp(prefix="tg-fuzz-")
_FILE = os.path.join(_TMP, "fuzz.heartbeat.json")


def check(data: bytes) -> None:
    try:
        hb = parse_heartbeat_bytes(data, "fuzz")
    except HeartbeatError:
        hb = None
    if len(data) % 8 == 0:  # now and then through a real file: the bounded, no-follow read
        with open(_FILE, "wb") as f:
            f.write(data)
        try:
            from_file = read_heartbeat(_FILE, check_name=False)
        except HeartbeatError:
            from_file = None
        assert (from_file is None) == (hb is None), "file and bytes disagree"
    if hb is None:
        return
    doc = hb.to_dict()
    again = parse_heartbeat(json.loads(json.dumps(doc)), "again")
    if not any(math.isnan(v) for v in hb.scalars.values()):
        assert again == hb, "accepted heartbeat does not round-trip"


def main() -> None:
    atheris.Setup(sys.argv, check)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
