"""Checkpoint files that carry their own length (trainguard.shared.selfcheck), written by the
real libraries: a safetensors file and a ``torch.save`` zip give the size they must have, a
copy cut short anywhere is told from the whole one, and a Hugging Face step directory nobody
recorded is complete at once when every file in it says so, never when one is cut short.
Recorded directories: tests/training/test_integrations_e2e.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard import checkpoint
from trainguard.shared.selfcheck import expected_size, indented_json_closed

safetensors_torch = pytest.importorskip("safetensors.torch")

HOUR = 3600.0


def _safetensors(path: Path) -> Path:
    safetensors_torch.save_file(
        {"w": torch.arange(1000, dtype=torch.float32), "b": torch.zeros(3, 7)},
        str(path),
        metadata={"format": "pt"},
    )
    return path


def _torch_zip(path: Path) -> Path:
    torch.save({"state": {0: {"exp_avg": torch.ones(500)}}, "lr": 0.1}, path)
    return path


def _cut(src: Path, dst: Path, n: int) -> Path:
    dst.write_bytes(src.read_bytes()[:n])
    return dst


def _expected(path: Path) -> int | None:
    return expected_size(path, os.lstat(path))


@pytest.mark.parametrize("make", [_safetensors, _torch_zip])
def test_a_whole_file_has_the_size_it_says(tmp_path: Path, make: object) -> None:
    path = make(tmp_path / ("x.safetensors" if make is _safetensors else "x.pt"))  # type: ignore[operator]
    assert _expected(path) == path.stat().st_size


@settings(max_examples=25)
@given(st.floats(0.0, 1.0, exclude_max=True), st.sampled_from(["x.safetensors", "x.pt"]))
def test_a_file_cut_short_anywhere_says_it_is_longer(
    tmp_path_factory: pytest.TempPathFactory, fraction: float, name: str
) -> None:
    where = tmp_path_factory.mktemp("cut")
    whole = (_safetensors if name.endswith(".safetensors") else _torch_zip)(where / name)
    size = whole.stat().st_size
    cut = _cut(whole, where / f"cut-{name}", int(size * fraction))
    got = _expected(cut)
    assert got is not None and got > cut.stat().st_size, (int(size * fraction), got)


def test_other_content_makes_no_claim(tmp_path: Path) -> None:
    legacy = tmp_path / "legacy.bin"
    torch.save({"a": 1}, legacy, _use_new_zipfile_serialization=False)
    assert _expected(legacy) is None  # torch's old format carries no length
    noise = tmp_path / "noise.safetensors"
    noise.write_bytes(b"\xff" * 64)
    assert _expected(noise) is None
    notes = tmp_path / "merges.txt"
    notes.write_text("a b\n")
    assert _expected(notes) is None
    good, bad = tmp_path / "config.json", tmp_path / "cut.json"
    good.write_text('{"n_layer": 1}')
    bad.write_text('{"n_layer": ')
    assert (_expected(good), _expected(bad)) == (good.stat().st_size, None)


def _hf_step(out: Path, step: int) -> Path:
    d = out / f"checkpoint-{step}"
    d.mkdir(parents=True)
    _safetensors(d / "model.safetensors")
    _torch_zip(d / "optimizer.pt")
    _torch_zip(d / "rng_state.pth")
    (d / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return d


def test_an_unrecorded_hf_directory_is_complete_at_once_and_never_when_cut(
    tmp_path: Path,
) -> None:
    """No record, an hour's grace period: complete at once because every file has the length
    its own format gives; a model.safetensors cut short makes ``latest`` go back a step."""
    _hf_step(tmp_path, 5)
    newest = _hf_step(tmp_path, 10)
    found = checkpoint.latest(tmp_path, pattern="checkpoint-{step}", grace=HOUR)
    assert found is not None and found.step == 10
    model = newest / "model.safetensors"
    with open(model, "r+b") as fh:
        fh.truncate(model.stat().st_size - 100)
    found = checkpoint.latest(tmp_path, pattern="checkpoint-{step}", grace=HOUR)
    assert found is not None and found.step == 5
    found = checkpoint.latest(tmp_path, pattern="checkpoint-{step}", grace=0)
    assert found is not None and found.step == 5  # settled: still not complete


def test_a_file_without_its_own_length_waits_for_the_grace_period(tmp_path: Path) -> None:
    d = _hf_step(tmp_path, 5)
    (d / "merges.txt").write_text("a b\n")
    assert checkpoint.latest(tmp_path, pattern="checkpoint-{step}", grace=HOUR) is None
    found = checkpoint.latest(tmp_path, pattern="checkpoint-{step}", grace=0)
    assert found is not None and found.step == 5


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=50)
@given(st.dictionaries(st.text(max_size=5), _JSON, min_size=1, max_size=4), st.data())
def test_an_indented_json_object_is_whole_only_at_its_last_byte(
    doc: dict[str, object], data: st.DataObject
) -> None:
    """As the Trainer writes trainer_state.json (``json.dumps(indent=2) + "\\n"``): the whole
    document is closed, no shorter prefix of it is."""
    raw = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"tg-selfcheck-{os.getpid()}.json"
    try:
        path.write_bytes(raw)
        fd = os.open(path, os.O_RDONLY)
        try:
            assert indented_json_closed(fd, len(raw))
            cut = data.draw(st.integers(0, len(raw) - 2))  # dropping the last newline is whole
            assert not indented_json_closed(fd, cut), raw[:cut]
        finally:
            os.close(fd)
    finally:
        path.unlink(missing_ok=True)
