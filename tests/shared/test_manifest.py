"""The manifest record format and the directory listing: strict, bounded, never fooled into
looking outside its directory, and cheap to re-read."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainguard.exporter.collectors.checkpoints.dirwatch import RecordCache
from trainguard.shared import manifest
from trainguard.shared.listing import list_directory, read_listing
from trainguard.shared.manifest import (
    MANIFEST_DIR,
    ManifestError,
    Record,
    parse_record,
    read_record,
    record_path,
    write_record,
)
from trainguard.shared.pattern import CheckpointPattern

SHA = "ab" * 32


def doc(**overrides: object) -> dict[str, object]:
    d: dict[str, object] = {
        "version": 1,
        "name": "step_1.pt",
        "step": 1,
        "size": 10,
        "sha256": SHA,
        "written": 1.5,
        "source": None,
    }
    d.update(overrides)
    return d


def raw(d: object) -> bytes:
    return json.dumps(d).encode()


plain_names = st.text(
    st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/\\:"),
    min_size=1,
    max_size=60,
).filter(lambda s: not s.startswith(".") and len(s.encode()) <= 255)

records = st.builds(
    Record,
    name=plain_names,
    step=st.integers(0, 2**63 - 1),
    size=st.integers(0, 2**63 - 1),
    sha256=st.none() | st.text("0123456789abcdef", min_size=64, max_size=64),
    written=st.floats(0, 4e9, allow_nan=False),
    source=st.none() | st.text(min_size=1, max_size=200),
    loss_finite=st.none() | st.booleans(),
)


@given(records)
def test_records_round_trip(rec: Record) -> None:
    assert parse_record(rec.encode(), name=rec.name) == rec


@given(st.binary(max_size=2000))
def test_any_bytes_are_a_record_or_a_manifest_error(data: bytes) -> None:
    try:
        rec = parse_record(data, name="step_1.pt")
    except ManifestError:
        return
    assert rec.name == "step_1.pt"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)


@given(st.sampled_from(sorted(doc())), json_values)
def test_any_field_value_is_accepted_only_when_valid(key: str, val: object) -> None:
    try:
        data = json.dumps(doc(**{key: val})).encode()
    except ValueError:
        return
    try:
        rec = parse_record(data, name="step_1.pt")
    except ManifestError:
        return
    # whatever was accepted is a well-typed record
    assert type(rec.step) is int and type(rec.size) is int and rec.step >= 0 and rec.size >= 0
    assert rec.sha256 is None or len(rec.sha256) == 64
    assert isinstance(rec.written, float) and rec.written >= 0


@given(st.dictionaries(st.text(max_size=10), json_values, max_size=9))
def test_arbitrary_objects_are_refused_unless_exactly_a_record(d: dict[str, object]) -> None:
    try:
        data = json.dumps(d).encode()
    except ValueError:
        return
    if set(d) - {"loss_finite"} != set(doc()):  # the one optional key
        with pytest.raises(ManifestError):
            parse_record(data, name="step_1.pt")


def test_loss_finite_is_optional_and_a_boolean() -> None:
    assert parse_record(raw(doc()), name="step_1.pt").loss_finite is None
    assert parse_record(raw(doc(loss_finite=False)), name="step_1.pt").loss_finite is False
    assert parse_record(raw(doc(loss_finite=None)), name="step_1.pt").loss_finite is None
    for bad in (0, 1, "false", [], {}):
        with pytest.raises(ManifestError, match="loss_finite: expected true, false or null"):
            parse_record(raw(doc(loss_finite=bad)), name="step_1.pt")
    # written only when known: a record without a run reads as older trainguard wrote it
    assert b"loss_finite" not in Record("a", 1, 1, None, 1.0).encode()


@pytest.mark.parametrize(
    "name",
    ["../step_1.pt", "/etc/passwd", "a/step_1.pt", "..", ".", "", ".hidden", "a\\b", "c:x", "a\nb"],
)
def test_a_record_naming_anything_but_a_plain_file_is_refused(name: str) -> None:
    with pytest.raises(ManifestError, match="plain file name"):
        parse_record(raw(doc(name=name)), name=name)


@pytest.mark.parametrize(
    "data, match",
    [
        (raw(doc(name="step_2.pt")), "names 'step_2.pt'"),
        (raw(doc(step=-1)), "step"),
        (raw(doc(step=True)), "step"),
        (raw(doc(size=1.0)), "size"),
        (raw(doc(size=2**63)), "size"),
        (raw(doc(sha256="AB" * 32)), "sha256"),
        (raw(doc(sha256="ab")), "sha256"),
        (raw(doc(written=-1)), "written"),
        (raw(doc(version=2)), "version"),
        (raw(doc(extra=1)), "unknown"),
        (b'{"version": 1, "version": 1}', "duplicate"),
        (raw(doc()).replace(b"1.5", b"NaN"), "not a number"),
        (raw([1]), "not a JSON object"),
        (b"\xff", "not a JSON record"),
        (b"[" * 100_000, "larger than"),
        (raw(doc(source="x" * 5000)), "source"),
    ],
)
def test_malformed_records_say_what_is_wrong(data: bytes, match: str) -> None:
    with pytest.raises(ManifestError, match=match):
        parse_record(data, name="step_1.pt")


@pytest.mark.parametrize(
    "name, step",
    [
        ("step_100.pt", 100),
        ("step_0100.safetensors", 100),
        ("step_7", 7),
        ("step_7.tar.gz", 7),
        ("step_100.pt.part", None),
        ("step_x.pt", None),
        ("step_.pt", None),
        ("xstep_1.pt", None),
        ("step_1_2.pt", None),
        (".trainguard", None),
        (".step_1.pt", None),
        ("step_" + "9" * 19, None),
    ],
)
def test_default_pattern(name: str, step: int | None) -> None:
    assert CheckpointPattern().step(name) == step


def test_partial_names_and_custom_patterns() -> None:
    p = CheckpointPattern()
    assert p.partial_step("step_100.pt.part") == 100
    assert p.partial_step("step_100.pt") is None
    assert p.partial_step("step_100.pt.part.part") is None
    c = CheckpointPattern("ckpt-{step}-model")
    assert c.step("ckpt-12-model.pt") == 12
    assert c.step("ckpt-12.pt") is None
    for bad in ("step", "{step}/x", ".x{step}", "step_{step}.part", "{step}{step}"):
        with pytest.raises(ValueError):
            CheckpointPattern(bad)


@given(st.integers(0, 10**18 - 1), st.from_regex(r"(\.[a-z0-9]{1,8}){0,2}", fullmatch=True))
def test_pattern_finds_any_step_with_any_extension(step: int, ext: str) -> None:
    p = CheckpointPattern("run-{step}")
    assert p.step(f"run-{step}{ext}") == step
    assert p.step(f"run-{step}{ext}.part") is None
    assert p.partial_step(f"run-{step}{ext}.part") == step


def test_write_read_and_cache(tmp_path: Path) -> None:
    rec = Record("step_1.pt", 1, 10, SHA, 1.0)
    write_record(tmp_path, rec)
    assert read_record(tmp_path, "step_1.pt") == rec
    assert read_record(tmp_path, "step_2.pt") is None
    # a temporary left by a writer killed mid-commit is ignored
    (tmp_path / MANIFEST_DIR / ".step_3.pt.dead.tmp").write_text("{garbage")
    cache = RecordCache(tmp_path)
    first = cache.read()
    assert first == {"step_1.pt": rec}
    again = cache.read()
    assert again["step_1.pt"] is first["step_1.pt"]  # unchanged: not parsed again
    rec2 = Record("step_1.pt", 1, 11, None, 2.0)
    write_record(tmp_path, rec2)
    assert cache.read() == {"step_1.pt": rec2}
    os.unlink(record_path(tmp_path, "step_1.pt"))
    assert cache.read() == {}


def test_unsafe_manifests_are_errors(tmp_path: Path) -> None:
    (tmp_path / "outside.json").write_text(json.dumps(doc()))
    mdir = tmp_path / "d" / MANIFEST_DIR
    mdir.mkdir(parents=True)
    link = mdir / "step_1.pt.json"
    link.symlink_to(tmp_path / "outside.json")
    with pytest.raises(ManifestError, match="link"):
        RecordCache(tmp_path / "d").read()
    with pytest.raises(ManifestError, match="link"):
        read_record(tmp_path / "d", "step_1.pt")
    link.unlink()
    (mdir / "step_1.pt.json").write_bytes(b" " * (manifest.MAX_RECORD_BYTES + 1))
    with pytest.raises(ManifestError, match="larger than"):
        RecordCache(tmp_path / "d").read()
    # the manifest directory itself replaced by a link
    e = tmp_path / "e"
    e.mkdir()
    (e / MANIFEST_DIR).symlink_to(mdir)
    with pytest.raises(ManifestError, match="not a directory"):
        RecordCache(e).read()


def test_record_count_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manifest, "MAX_RECORDS", 3)
    for i in range(4):
        write_record(tmp_path, Record(f"step_{i}.pt", i, 1, None, 1.0))
    with pytest.raises(ManifestError, match="more than 3"):
        RecordCache(tmp_path).read()


def test_listing_is_pattern_only_and_refuses_links(tmp_path: Path) -> None:
    (tmp_path / "step_1.pt").write_bytes(b"x")
    (tmp_path / "step_2.pt.part").write_bytes(b"xx")
    (tmp_path / "notes.txt").write_bytes(b"")
    (tmp_path / "step_3").mkdir()  # directories are not checkpoints
    listing = read_listing(tmp_path, CheckpointPattern())
    assert [(e.name, e.step) for e in listing.files] == [("step_1.pt", 1)]
    assert [(e.name, e.step) for e in listing.partials] == [("step_2.pt.part", 2)]
    # a record naming a directory is an error, as is any link with a checkpoint's name
    write_record(tmp_path, Record("step_3", 3, 1, None, 1.0))
    with pytest.raises(ManifestError, match="non-regular"):
        read_listing(tmp_path, CheckpointPattern())
    os.unlink(record_path(tmp_path, "step_3"))
    (tmp_path / "step_4.pt").symlink_to("/etc/hostname")
    with pytest.raises(ManifestError, match="symbolic link"):
        list_directory(tmp_path, CheckpointPattern(), {})


def test_directory_records_round_trip_and_refuse_paths_outside() -> None:
    from trainguard.shared.manifest import MAX_RECORD_BYTES, parse_record

    files = tuple((f"rank{i:04d}/shard.distcp", 1000 + i, "a" * 64) for i in range(400))
    rec = Record("step-5", 5, sum(f[1] for f in files), None, 1.0, files=files)
    data = rec.encode()
    assert len(data) > MAX_RECORD_BYTES  # a directory's record may be larger than a file's
    assert parse_record(data, name="step-5") == rec
    for bad in ("../x", "/etc/passwd", "a//b", "a/./b", "a/\x00b", ""):
        doc = json.loads(Record("step-5", 5, 1, None, 1.0, files=((bad, 1, None),)).encode())
        with pytest.raises(ManifestError, match="not a path inside"):
            parse_record(json.dumps(doc, sort_keys=True).encode(), name="step-5")
    unsorted = Record("step-5", 5, 2, None, 1.0, files=(("b", 1, None), ("a", 1, None)))
    with pytest.raises(ManifestError, match="sorted and unique"):
        parse_record(unsorted.encode(), name="step-5")
    # a file's record (no "files") is still held to 16 KiB
    big = json.loads(Record("step_5.pt", 5, 1, None, 1.0, source="/" + "x" * 4000).encode())
    big["source"] = "/" + "x" * 20000
    with pytest.raises(ManifestError, match="larger than"):
        parse_record(json.dumps(big, sort_keys=True).encode(), name="step_5.pt")
