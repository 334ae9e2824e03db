"""``trainguard.checkpoint.adopt``: recording a step directory a framework finished writing in
place, and forgetting the records of the directories it rotated away."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from trainguard import checkpoint
from trainguard.checkpoint.adopt import forget_removed, record_dir
from trainguard.shared.manifest import read_all_records


def _step(out: Path, step: int) -> Path:
    d = out / f"checkpoint-{step}"
    (d / "sub").mkdir(parents=True)
    (d / "weights.raw").write_bytes(b"w" * (1000 + step))
    (d / "sub" / "notes.txt").write_text("x")
    return d


def test_a_recorded_directory_is_complete_at_once_and_its_files_checked(tmp_path: Path) -> None:
    d = _step(tmp_path, 5)
    rec = record_dir(d, pattern="checkpoint-{step}")
    assert (rec.name, rec.step, rec.size) == ("checkpoint-5", 5, 1006)
    sha = hashlib.sha256(b"w" * 1005).hexdigest()
    assert rec.files == (("sub/notes.txt", 1, rec.files[0][2]), ("weights.raw", 1005, sha))
    assert read_all_records(tmp_path) == {"checkpoint-5": rec}
    # no framework marker here, an hour's grace: only the record makes it complete
    found = checkpoint.latest(tmp_path, pattern="checkpoint-{step}", grace=3600, verify_hash=True)
    assert found is not None and found.step == 5
    (d / "weights.raw").write_bytes(b"w" * 10)
    assert checkpoint.latest(tmp_path, pattern="checkpoint-{step}", grace=0) is None
    sizes = record_dir(d, pattern="checkpoint-{step}", hashing=False)
    assert sizes.files == (("sub/notes.txt", 1, None), ("weights.raw", 10, None))


def test_bad_input_is_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a step directory name"):
        record_dir(_step(tmp_path, 5), pattern="step-{step}")
    with pytest.raises(FileNotFoundError):
        record_dir(tmp_path / "checkpoint-9", pattern="checkpoint-{step}")
    (tmp_path / "checkpoint-8").mkdir()
    with pytest.raises(ValueError, match="no file"):
        record_dir(tmp_path / "checkpoint-8", pattern="checkpoint-{step}")


def test_records_of_rotated_directories_are_forgotten(tmp_path: Path) -> None:
    for step in (5, 10, 15):
        record_dir(_step(tmp_path, step), pattern="checkpoint-{step}")
    checkpoint.save(b"single file", tmp_path / "step_1.pt")  # not a step directory record
    shutil.rmtree(tmp_path / "checkpoint-5")  # the Trainer's save_total_limit
    assert forget_removed(tmp_path, pattern="checkpoint-{step}") == ["checkpoint-5"]
    assert sorted(read_all_records(tmp_path)) == ["checkpoint-10", "checkpoint-15", "step_1.pt"]
