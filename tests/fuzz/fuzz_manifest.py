"""Coverage-guided fuzzing (atheris/libFuzzer) of the manifest record reader and the checkpoint
name pattern: any bytes give a Record or a ManifestError, nothing else; an accepted record
names exactly the plain file it was asked about and encodes back to itself; no name makes the
pattern raise or accept a name that is not plain. See README.md in this directory."""

from __future__ import annotations

import sys

import _common  # noqa: F401  (sys.path for this checkout)
import atheris

with atheris.instrument_imports():
    from trainguard.shared.manifest import ManifestError, parse_record
    from trainguard.shared.pattern import CheckpointPattern, is_plain_name

NAME = "step_1.pt"
PATTERN = CheckpointPattern()


def check(data: bytes) -> None:
    try:
        rec = parse_record(data, name=NAME)
    except ManifestError:
        rec = None
    if rec is not None:
        assert rec.name == NAME
        assert 0 <= rec.step < 2**63 and 0 <= rec.size < 2**63
        assert parse_record(rec.encode(), name=NAME) == rec, "record does not round-trip"
    name = data[:300].decode("utf-8", "surrogateescape")  # as os.scandir gives names
    for step in (PATTERN.step(name), PATTERN.partial_step(name)):
        if step is not None:
            assert 0 <= step < 10**18 and is_plain_name(name.removesuffix(".part"))


def main() -> None:
    atheris.Setup(sys.argv, check)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
