"""A bounded fuzz run of the heartbeat reader and the manifest record reader in the normal
suite: the atheris harnesses in tests/fuzz/ for a few seconds each (coverage-guided, seeded
with the bad-input corpora), or, where atheris is not installed, a hypothesis run of many
mutated seeds steered by ``hypothesis.target`` towards inputs that get further into the
parser. Any exception other than HeartbeatError / ManifestError fails. Longer runs by hand:
tests/fuzz/README.md."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st

from helpers.paths import DATA, TESTS
from trainguard.shared.heartbeat.read import parse_heartbeat_bytes
from trainguard.shared.heartbeat.record import HeartbeatError
from trainguard.shared.manifest import ManifestError, parse_record

FUZZ = TESTS / "fuzz"
# A fixed seed and a fixed number of inputs: the suite's fuzz run is the same every time, so
# CI is not made red by chance; open-ended runs that look for new inputs are in the README.
RUNS = {"heartbeat": 120_000, "manifest": 500_000}  # about 6-8 s each on a 2-core VM
SEED = 20261129
HAVE_ATHERIS = importlib.util.find_spec("atheris") is not None
SEEDS = {"heartbeat": DATA / "heartbeats", "manifest": DATA / "manifests"}


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_ATHERIS, reason="atheris not installed: the hypothesis run covers")
@pytest.mark.parametrize("what", sorted(SEEDS))
def test_atheris_fuzz_run(tmp_path: Path, what: str) -> None:
    corpus = tmp_path / "corpus"  # libFuzzer adds what it finds to the first corpus dir
    shutil.copytree(SEEDS[what], corpus)
    cmd = [
        sys.executable,
        str(FUZZ / f"fuzz_{what}.py"),
        str(corpus),
        f"-runs={RUNS[what]}",
        f"-seed={SEED}",
        f"-dict={FUZZ / 'json.dict'}",
        "-timeout=10",
        "-rss_limit_mb=2048",
        f"-artifact_prefix={tmp_path}/",
        "-print_final_stats=1",
    ]
    # a fixed number of inputs: on a busy machine that takes many times longer than quietly
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    crashes = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("crash", "oom")))
    assert r.returncode == 0 and not crashes, f"{crashes}\n{r.stdout[-4000:]}{r.stderr[-8000:]}"
    assert "Done " in r.stderr and "stat::number_of_executed_units" in r.stderr


# ---------------------------------------------------------------- without atheris


def _seeds(what: str) -> list[bytes]:
    return [p.read_bytes() for p in sorted(SEEDS[what].iterdir())]


def _mutated(what: str) -> st.SearchStrategy[bytes]:
    """A seed with a few splices: replace bytes at a position with others."""
    edits = st.lists(
        st.tuples(st.integers(0, 2000), st.integers(0, 8), st.binary(max_size=8)), max_size=6
    )

    def apply(seed: bytes, changes: list[tuple[int, int, bytes]]) -> bytes:
        data = bytearray(seed)
        for at, cut, new in changes:
            at = at % (len(data) + 1)
            data[at : at + cut] = new
        return bytes(data)

    return st.builds(apply, st.sampled_from(_seeds(what)), edits) | st.binary(max_size=600)


def _depth(message: str) -> float:
    """How far into the parser an input got: JSON errors 0, field errors 1 + the field's
    nesting, accepted 10."""
    if "field '" not in message and "expected" not in message:
        return 0.0
    return 1.0 + message.count(".") + message.count("[")


@pytest.mark.skipif(HAVE_ATHERIS, reason="atheris is installed: the coverage-guided run covers")
@settings(max_examples=4000, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=_mutated("heartbeat"))
def test_hypothesis_fuzz_heartbeat(data: bytes) -> None:
    try:
        hb = parse_heartbeat_bytes(data, "fuzz")
    except HeartbeatError as exc:
        target(_depth(str(exc)), label="depth")
        return
    target(10.0, label="depth")
    json.dumps(hb.to_dict())


@pytest.mark.skipif(HAVE_ATHERIS, reason="atheris is installed: the coverage-guided run covers")
@settings(max_examples=4000, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=_mutated("manifest"))
def test_hypothesis_fuzz_manifest(data: bytes) -> None:
    try:
        rec = parse_record(data, name="step_1.pt")
    except ManifestError as exc:
        target(_depth(str(exc)), label="depth")
        return
    target(10.0, label="depth")
    assert parse_record(rec.encode(), name="step_1.pt") == rec
