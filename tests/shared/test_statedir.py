"""The names of state files: the same name for the same run or directory, release after release.

A heartbeat, a save status or a restore result written by one version of trainguard is read by
the exporter of another (a training job keeps its old reporter while the exporter is upgraded):
a change of the naming scheme would orphan every file in every state directory. The names are
pinned as literals, computed once from the scheme before it was shared by the three writers.
"""

from __future__ import annotations

from pathlib import Path

from trainguard.exporter.collectors.restore.result import result_filename
from trainguard.shared.heartbeat.record import heartbeat_filename
from trainguard.shared.save_status import status_path
from trainguard.shared.statedir import state_file_stem


def test_heartbeat_names_are_stable() -> None:
    assert heartbeat_filename("llama/ft..x", 3) == "llama_ft_x-581dfa44.rank3.heartbeat.json"
    assert heartbeat_filename("日本", 1) == "run-cf2abf0c.rank1.heartbeat.json"


def test_save_status_names_are_stable() -> None:
    assert status_path("/s", "/data/ckpt/run-1") == Path("/s/saves/run-1-e7bfd8309d4780b4.json")
    assert status_path("/s", "/") == Path("/s/saves/root-8a5edab282632443.json")


def test_restore_result_names_are_stable() -> None:
    assert result_filename("/data/ckpt/", "llama ft", "primary") == "llama_ft-f06568d2.restore.json"
    assert result_filename("/data/ckpt/", None, None) == "ckpt-34a7a946.restore.json"


def test_names_that_sanitise_alike_stay_apart() -> None:
    assert state_file_stem("a/b", "a/b", fallback="run") != state_file_stem(
        "a_b", "a_b", fallback="run"
    )
    assert state_file_stem("x" * 100, "k", fallback="run").startswith("x" * 48 + "-")
    # a lone surrogate (an undecodable byte of a path) names a file instead of raising
    assert state_file_stem("\udcff", "/d/\udcff", fallback="root").startswith("root-")
