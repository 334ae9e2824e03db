"""The heartbeat format: safe file names, atomic writes, and a reader that turns anything a
stranger could put in the state dir into a HeartbeatError naming the file and the field."""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainguard.shared.gpu_uuid import normalize_gpu_uuid
from trainguard.shared.heartbeat.read import parse_heartbeat, read_heartbeat
from trainguard.shared.heartbeat.record import (
    CAUSES,
    MAX_BYTES,
    AllocatorStats,
    Death,
    Heartbeat,
    HeartbeatError,
    check_run_name,
    heartbeat_filename,
    write_heartbeat,
)

SAFE_FILE = re.compile(r"^[A-Za-z0-9_-]{1,48}-[0-9a-f]{8}\.rank\d+\.heartbeat\.json$")


def sample_heartbeat(**over: Any) -> Heartbeat:
    fields: dict[str, Any] = dict(
        run="llama-ft",
        rank=3,
        pid=4242,
        create_time=1_700_000_000.25,
        host="gpu-box",
        started=1_700_000_001.0,
        time=1_700_000_100.5,
        step=320,
        step_time=1_700_000_100.0,
        scalars={"loss": 3.5, "tokens_per_s": 1234.0},
        world_size=8,
        boot_id="4ec813df-a3b7-4a83-b474-cd978df6b91d",
        boot_time=1_699_999_000.0,
        pid_ns=4026531836,
        start_ticks=12_345_678,
        checkpoint_dir="/data/ckpt",
        mirrors={"backup": "/mnt/d/ckpt"},
        log_file="/data/train.log",
        allocator=(AllocatorStats(0, 10, 20, 15, 3, 1, 0),),
        memory_snapshots=1,
        deaths=2,
        death_history=(
            Death(step=300, time=1_699_999_500.0, detected=1_700_000_001.0, cause="unknown"),
        ),
        version="0.1.0",
    )
    fields.update(over)
    return Heartbeat(**fields)


@pytest.mark.parametrize(
    "name",
    ["llama-ft", "a/b", "../../etc/passwd", "..", "ünïcødé ✓", "x" * 128, "with space", "-"],
)
def test_file_names_are_safe_and_tell_names_apart(name: str) -> None:
    fn = heartbeat_filename(name, 7)
    assert SAFE_FILE.match(fn), fn
    assert check_run_name(name) is None
    # names that sanitize alike still get their own file
    assert heartbeat_filename(name + "/", 7) != fn
    assert heartbeat_filename(name, 8) != fn


@pytest.mark.parametrize(
    ("name", "problem"),
    [("", "1-128 characters"), ("x" * 129, "1-128"), ("a\nb", "control"), ("\ud800", "surrogate")],
)
def test_bad_run_names(name: str, problem: str) -> None:
    reason = check_run_name(name)
    assert reason is not None and problem in reason


def test_write_then_read_round_trips(tmp_path: Path) -> None:
    hb = sample_heartbeat()
    path = tmp_path / hb.filename
    write_heartbeat(path, hb)
    assert read_heartbeat(path) == hb
    assert oct(path.stat().st_mode & 0o777) == oct(0o644 & ~_umask())
    assert os.listdir(tmp_path) == [hb.filename]  # no temp file left behind
    # a dict is accepted too (the format is plain JSON)
    write_heartbeat(path, {**hb.to_dict(), "step": 321})
    assert read_heartbeat(path).step == 321


def test_a_gpu_error_death_reads_as_unknown_to_older_readers(tmp_path: Path) -> None:
    """``gpu_xid`` is not a cause format-1 readers before it know (they would refuse the
    whole file): it is written as ``unknown`` with the new field ``xid``, which newer
    readers read back as ``gpu_xid``."""
    death = Death(step=7, time=1e9, detected=1e9 + 5, cause="gpu_xid", xid=79)
    hb = sample_heartbeat(
        death_history=(
            death,
            Death(step=8, time=1e9 + 6, detected=1e9 + 9, cause="exception", xid=48),
        )
    )
    path = tmp_path / hb.filename
    write_heartbeat(path, hb)
    written = json.loads(path.read_text())["death_history"]
    assert written[0]["cause"] == "unknown" and written[0]["xid"] == 79
    assert written[1]["cause"] == "exception" and written[1]["xid"] == 48
    assert read_heartbeat(path) == hb
    assert all(d["cause"] in ("reboot", "oom_killer", "exception", "unknown") for d in written)


def test_write_replaces_a_planted_symlink_instead_of_following_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    hb = sample_heartbeat()
    path = tmp_path / hb.filename
    path.symlink_to(victim)
    write_heartbeat(path, hb)
    assert victim.read_text() == "precious"
    assert not path.is_symlink()


def test_failed_write_leaves_no_temp_and_the_old_file(tmp_path: Path, monkeypatch: Any) -> None:
    hb = sample_heartbeat()
    path = tmp_path / hb.filename
    write_heartbeat(path, hb)

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError):
        write_heartbeat(path, sample_heartbeat(step=999))
    assert os.listdir(tmp_path) == [hb.filename]
    assert read_heartbeat(path).step == 320


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_doc(tmp_path: Path, doc: Any, name: str | None = None) -> Path:
    path = tmp_path / (name or heartbeat_filename("llama-ft", 3))
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"run": "x" * 129}, "run", "1-128 characters"),
        ({"run": 5}, "run", "expected a string"),
        ({"rank": True}, "rank", "expected an integer"),
        ({"rank": -1}, "rank", "0..1000000"),
        ({"pid": 0}, "pid", "expected an integer in 1.."),
        ({"pid": None}, "pid", "missing"),
        ({"create_time": "yesterday"}, "create_time", "seconds since the epoch"),
        ({"start_ticks": -1}, "start_ticks", "expected an integer in 0.."),
        ({"start_ticks": 1.5}, "start_ticks", "expected an integer"),
        ({"time": -5}, "time", "seconds since the epoch in"),
        ({"time": 1e300}, "time", "seconds since the epoch in"),
        ({"state": "zombie"}, "state", "expected one of running, finished, failed"),
        ({"step": 1.5}, "step", "expected an integer"),
        ({"step": 2**64}, "step", "expected an integer in"),
        ({"scalars": {"bad name": 1}}, "scalars", "letters, digits"),
        ({"scalars": {"loss": "low"}}, "scalars.loss", "expected a number"),
        ({"scalars": {f"s{i}": 1 for i in range(17)}}, "scalars", "at most 16"),
        ({"mirrors": {"primary": "/x"}}, "mirrors", "other than 'primary'"),
        ({"mirrors": {"b": "relative/x"}}, "mirrors.b", "absolute path"),
        ({"checkpoint_dir": "ckpt"}, "checkpoint_dir", "absolute path"),
        ({"log_file": "/x\x00y"}, "log_file", "control characters"),
        ({"host": "h" * 300}, "host", "at most 255"),
        ({"allocator": {}}, "allocator", "expected a list"),
        ({"allocator": [{"device": 0}]}, "allocator[0].allocated_bytes", "missing"),
        (
            {"allocator": [vars(AllocatorStats(1, 1, 1, 1, 1, 1, 1))] * 2},
            "allocator[1].device",
            "listed twice",
        ),
        (
            {"allocator": [{**vars(AllocatorStats(1, 1, 1, 1, 1, 1, 1)), "uuid": "GPU-1"}]},
            "allocator[0].uuid",
            "expected a GPU UUID",
        ),
        (
            {"allocator": [{**vars(AllocatorStats(1, 1, 1, 1, 1, 1, 1)), "uuid": 7}]},
            "allocator[0].uuid",
            "expected a string",
        ),
        (
            {"allocator": [{**vars(AllocatorStats(1, 1, 1, 1, 1, 1, 1)), "total_bytes": 0}]},
            "allocator[0].total_bytes",
            "expected an integer in 1..",
        ),
        (
            {"allocator": [{**vars(AllocatorStats(1, 1, 1, 1, 1, 1, 1)), "total_bytes": "80G"}]},
            "allocator[0].total_bytes",
            "expected an integer",
        ),
        (
            {"death_history": [{"time": 1, "detected": 2, "cause": "x"}]},
            "death_history[0].cause",
            "one of",
        ),
        ({"death_history": [{}] * 21}, "death_history", "at most 20"),
        (
            {"death_history": [{"time": 1, "detected": 2, "cause": "unknown", "xid": -1}]},
            "death_history[0].xid",
            "expected an integer in",
        ),
        ({"deaths": -1}, "deaths", "expected an integer in"),
    ],
)
def test_each_bad_field_is_named(
    tmp_path: Path, change: dict[str, Any], field: str, message: str
) -> None:
    doc = {**sample_heartbeat().to_dict(), **change}
    path = write_doc(tmp_path, doc, "file.heartbeat.json")
    with pytest.raises(HeartbeatError) as err:
        read_heartbeat(path, check_name=False)
    text = str(err.value)
    assert text.startswith(f"{path}: field '{field}': "), text
    assert message in text, text


def test_file_level_problems(tmp_path: Path) -> None:
    good = sample_heartbeat()
    cases: dict[str, tuple[bytes | None, str]] = {
        "empty": (b"", "empty file"),
        "truncated": (json.dumps(good.to_dict()).encode()[:100], "not valid JSON"),
        "binary": (b"\x89PNG\r\n\x1a\n\x00\x00", "not UTF-8"),
        "list": (b"[1, 2]", "expected a JSON object, got a list"),
        "foreign": (json.dumps({"format": 2}).encode(), "unsupported heartbeat format 2"),
        "bool-format": (json.dumps({"format": True}).encode(), "unsupported heartbeat format"),
        "no-format": (json.dumps({"run": "x"}).encode(), "not a trainguard heartbeat"),
        "deep": (b"[" * 100_000 + b"]" * 100_000, "not usable JSON"),
        "long-int": (b'{"format": 1, "pid": ' + b"9" * 5000 + b"}", "not usable JSON"),
        # json's own message ends in "at": said once ("at at line 1" before)
        "control": (
            b'{"format": 1, "run": "a\x01b"}',
            "not valid JSON: Invalid control character at line 1 column 24",
        ),
    }
    for name, (content, reason) in cases.items():
        path = tmp_path / f"{name}.heartbeat.json"
        path.write_bytes(content or b"")
        with pytest.raises(HeartbeatError, match=re.escape(reason)) as err:
            read_heartbeat(path)
        assert str(err.value).startswith(str(path)), err.value


def test_huge_symlink_fifo_and_missing_are_refused(tmp_path: Path) -> None:
    huge = tmp_path / "huge.heartbeat.json"
    with open(huge, "wb") as fh:
        fh.truncate(MAX_BYTES + 1)
    with pytest.raises(HeartbeatError, match="larger than the 1 MiB limit"):
        read_heartbeat(huge)
    good = sample_heartbeat()
    target = tmp_path / "elsewhere"
    write_heartbeat(target, good)
    link = tmp_path / good.filename
    link.symlink_to(target)
    with pytest.raises(HeartbeatError, match="symbolic link"):
        read_heartbeat(link)
    fifo = tmp_path / "fifo.heartbeat.json"
    os.mkfifo(fifo)
    with pytest.raises(HeartbeatError, match="not a regular file"):
        read_heartbeat(fifo)  # must not block waiting for a writer
    with pytest.raises(HeartbeatError, match="cannot open"):
        read_heartbeat(tmp_path / "missing.heartbeat.json")


def test_a_renamed_heartbeat_is_not_trusted(tmp_path: Path) -> None:
    hb = sample_heartbeat()
    path = tmp_path / heartbeat_filename("other-run", 3)
    write_heartbeat(path, hb)
    with pytest.raises(HeartbeatError, match="file name does not match"):
        read_heartbeat(path)
    assert read_heartbeat(path, check_name=False) == hb


def test_unknown_fields_are_ignored_and_nan_scalars_kept(tmp_path: Path) -> None:
    doc = sample_heartbeat().to_dict()
    doc["added_in_a_later_version"] = {"x": [1, 2]}
    doc["scalars"] = {"loss": float("nan")}
    path = tmp_path / heartbeat_filename("llama-ft", 3)
    path.write_text(json.dumps(doc))  # json writes NaN as the NaN token
    hb = read_heartbeat(path)
    assert hb.scalars["loss"] != hb.scalars["loss"]


def test_error_messages_do_not_quote_file_contents(tmp_path: Path) -> None:
    secret = "hunter2-secret-value"
    for doc in (
        {"format": 1, "run": secret * 10},
        {
            "format": 1,
            "run": "x",
            "rank": 0,
            "pid": 1,
            "create_time": 1,
            "started": 1,
            "time": 1,
            "state": secret,
        },
        {"format": secret},
    ):
        with pytest.raises(HeartbeatError) as err:
            parse_heartbeat(doc, "f")
        assert secret not in str(err.value)


# -- property tests: nothing a file can hold makes the reader raise anything else ----------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
FIELDS = list(sample_heartbeat().to_dict())


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=2000))
def test_arbitrary_bytes_only_raise_heartbeat_error(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "fuzz.heartbeat.json"
    path.write_bytes(data)
    with contextlib.suppress(HeartbeatError):
        read_heartbeat(path)


@settings(max_examples=300, deadline=None)
@given(value=json_values)
def test_arbitrary_json_only_raises_heartbeat_error(value: Any) -> None:
    with contextlib.suppress(HeartbeatError):
        parse_heartbeat(value, "fuzz")


@settings(max_examples=500, deadline=None)
@given(
    changes=st.dictionaries(st.sampled_from(FIELDS), json_values, min_size=1, max_size=4),
    drop=st.sets(st.sampled_from(FIELDS), max_size=3),
)
def test_mutated_heartbeats_are_valid_or_heartbeat_error(
    changes: dict[str, Any], drop: set[str]
) -> None:
    doc = {**sample_heartbeat().to_dict(), **changes}
    for key in drop:
        doc.pop(key, None)
    try:
        hb = parse_heartbeat(doc, "fuzz")
    except HeartbeatError:
        return
    # whatever passed is safe to publish: the run name encodes, counts are bounded
    assert check_run_name(hb.run) is None
    assert len(hb.scalars) <= 16 and len(hb.death_history) <= 20
    assert all(d.cause in CAUSES for d in hb.death_history)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    run=st.text(min_size=1, max_size=128).filter(lambda s: check_run_name(s) is None),
    rank=st.integers(0, 1_000_000),
    step=st.none() | st.integers(0, 2**63 - 1),
    scalars=st.dictionaries(
        st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,63}", fullmatch=True),
        st.floats(allow_nan=False),
        max_size=16,
    ),
)
def test_valid_heartbeats_round_trip(
    tmp_path: Path, run: str, rank: int, step: int | None, scalars: dict[str, float]
) -> None:
    hb = sample_heartbeat(run=run, rank=rank, step=step, scalars=scalars)
    path = tmp_path / hb.filename
    write_heartbeat(path, hb)
    assert read_heartbeat(path) == hb


# -- GPU UUIDs: the join between a process's CUDA devices and NVML's GPUs ---------------------

NVML_SPELLING = "GPU-5d6c1b0b-4b3c-fa1e-8f07-2a9b3c4d5e6f"


@pytest.mark.parametrize(
    "spelling",
    [
        NVML_SPELLING,  # nvmlDeviceGetUUID
        "5d6c1b0b-4b3c-fa1e-8f07-2a9b3c4d5e6f",  # str(torch.cuda.get_device_properties(i).uuid)
        "GPU-5D6C1B0B-4B3C-FA1E-8F07-2A9B3C4D5E6F",
        "gpu-5d6c1b0b-4b3c-fa1e-8f07-2a9b3c4d5e6f",
        "  5D6C1B0B-4B3C-FA1E-8F07-2A9B3C4D5E6F\n",
    ],
)
def test_both_spellings_of_a_gpu_uuid_normalise_to_nvmls(spelling: str) -> None:
    assert normalize_gpu_uuid(spelling) == NVML_SPELLING


class _CudaUuid:
    """Like torch's ``_CUuuid``: str() gives the bare hex with dashes."""

    def __str__(self) -> str:
        return "5d6c1b0b-4b3c-fa1e-8f07-2a9b3c4d5e6f"


@pytest.mark.parametrize(
    "value",
    [
        "",
        "GPU-",
        "MIG-5d6c1b0b-4b3c-fa1e-8f07-2a9b3c4d5e6f",  # a MIG instance is not a GPU
        "5d6c1b0b4b3cfa1e8f072a9b3c4d5e6f",  # no dashes: not how either side writes it
        "5d6c1b0b-4b3c-fa1e-8f07-2a9b3c4d5e6",
        "GPU-5d6c1b0b-4b3c-fa1e-8f07-2a9b3c4d5e6fx",
        "zz6c1b0b-4b3c-fa1e-8f07-2a9b3c4d5e6f",
        None,
        12,
    ],
)
def test_what_is_not_a_gpu_uuid(value: Any) -> None:
    assert normalize_gpu_uuid(value) is None


def test_a_cuda_uuid_object_normalises_through_str() -> None:
    assert normalize_gpu_uuid(_CudaUuid()) == NVML_SPELLING


def test_allocator_uuid_round_trips_and_is_optional(tmp_path: Path) -> None:
    hb = sample_heartbeat(allocator=(AllocatorStats(0, 10, 20, 15, 3, 1, 0, NVML_SPELLING),))
    path = tmp_path / hb.filename
    write_heartbeat(path, hb)
    assert read_heartbeat(path).allocator[0].uuid == NVML_SPELLING
    # written by an older reporter: no uuid key at all
    doc = hb.to_dict()
    del doc["allocator"][0]["uuid"]
    path.write_text(json.dumps(doc))
    assert read_heartbeat(path).allocator[0].uuid is None
    # the reader accepts torch's spelling and keeps NVML's
    doc["allocator"][0]["uuid"] = "5D6C1B0B-4B3C-FA1E-8F07-2A9B3C4D5E6F"
    path.write_text(json.dumps(doc))
    assert read_heartbeat(path).allocator[0].uuid == NVML_SPELLING


def test_allocator_device_size_round_trips_and_is_optional(tmp_path: Path) -> None:
    """``total_bytes`` (the device's size, for the leak warning) is written only when known:
    a reader that predates it ignores it, and a heartbeat without it reads as unknown."""
    sized = AllocatorStats(0, 10, 20, 15, 3, 1, 0, total_bytes=80 << 30)
    hb = sample_heartbeat(allocator=(sized, AllocatorStats(1, 10, 20, 15, 3, 1, 0)))
    path = tmp_path / hb.filename
    write_heartbeat(path, hb)
    doc = json.loads(path.read_text())
    assert doc["allocator"][0]["total_bytes"] == 80 << 30
    assert "total_bytes" not in doc["allocator"][1]
    assert [a.total_bytes for a in read_heartbeat(path).allocator] == [80 << 30, None]
