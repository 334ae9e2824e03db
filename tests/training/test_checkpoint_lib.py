"""trainguard.checkpoint: save, mirror, prune and latest, one process at a time (the crash
cases are in test_checkpoint_faults.py)."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.exporter_proc import child_env
from trainguard.checkpoint import CheckpointError, latest, mirror, prune, save, transfer
from trainguard.shared.manifest import MANIFEST_DIR, Record, read_record, record_path, write_record


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_save_bytes_callable_and_big_writes(tmp_path: Path) -> None:
    data = os.urandom(5000)
    rec = save(data, tmp_path / "step_1.bin")
    assert (tmp_path / "step_1.bin").read_bytes() == data
    assert (rec.step, rec.size, rec.sha256, rec.source) == (1, 5000, sha(data), None)
    assert read_record(tmp_path, "step_1.bin") == rec
    # many small writes are gathered, big ones hashed on a helper thread: same bytes, same hash
    pieces = [os.urandom(n) for n in (1, 300, 70_000, 2 * 1024 * 1024, 5, 20 * 1024 * 1024, 9)]
    rec = save(lambda f: [f.write(p) for p in pieces], tmp_path / "step_2.bin")
    whole = b"".join(pieces)
    assert (tmp_path / "step_2.bin").read_bytes() == whole
    assert (rec.size, rec.sha256) == (len(whole), sha(whole))
    assert sorted(os.listdir(tmp_path)) == [MANIFEST_DIR, "step_1.bin", "step_2.bin"]


def test_save_torch_objects(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(4, 3)
    rec = save(model, tmp_path / "step_3.pt")  # a Module is callable, but it is torch's
    loaded = torch.load(tmp_path / "step_3.pt", weights_only=False)
    assert torch.equal(loaded.weight, model.weight)
    tensors = {"w": torch.randn(3_000_000)}
    rec = save(tensors, tmp_path / "step_4.pt")
    assert rec.sha256 == sha((tmp_path / "step_4.pt").read_bytes())
    found = latest(tmp_path)
    assert found is not None and found.step == 4
    assert torch.equal(torch.load(found)["w"], tensors["w"])


def test_bytes_and_callables_never_import_torch(tmp_path: Path) -> None:
    code = (
        "import sys; from trainguard import checkpoint as c\n"
        f"c.save(b'abc', {str(tmp_path / 'step_1.bin')!r})\n"
        f"c.save(lambda f: f.write(b'x'), {str(tmp_path / 'step_2.bin')!r})\n"
        f"c.mirror({str(tmp_path / 'step_1.bin')!r}, {str(tmp_path / 'm')!r})\n"
        f"c.latest({str(tmp_path)!r}); c.prune({str(tmp_path)!r}, keep=1)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    (tmp_path / "m").mkdir()
    subprocess.run([sys.executable, "-c", code], env=child_env(), check=True, timeout=120)


def test_save_refuses_names_the_exporter_would_not_see(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not match"):
        save(b"x", tmp_path / "model.pt")
    assert save(b"x", tmp_path / "ck-5.pt", pattern="ck-{step}").step == 5


def test_a_failed_save_leaves_nothing_named(tmp_path: Path) -> None:
    def broken(f: object) -> None:
        f.write(b"half")  # type: ignore[attr-defined]
        raise RuntimeError("serializer failed")

    with pytest.raises(RuntimeError):
        save(broken, tmp_path / "step_1.bin")
    assert os.listdir(tmp_path) == []


def test_a_part_being_written_by_a_live_writer_is_not_taken_over(tmp_path: Path) -> None:
    part = tmp_path / "step_1.bin.part"
    with open(part, "wb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(FileExistsError):
            save(b"new", tmp_path / "step_1.bin")
        assert part.exists()
    # an orphan (its writer died: no lock) is reused
    save(b"new", tmp_path / "step_1.bin")
    assert not part.exists() and (tmp_path / "step_1.bin").read_bytes() == b"new"


def test_resaving_a_step_replaces_file_and_record(tmp_path: Path) -> None:
    save(b"old", tmp_path / "step_1.bin")
    rec = save(b"newer", tmp_path / "step_1.bin")
    assert read_record(tmp_path, "step_1.bin") == rec
    assert rec.size == 5


def test_mirror_copies_checks_and_records(tmp_path: Path) -> None:
    p, m = tmp_path / "p", tmp_path / "m"
    p.mkdir()
    m.mkdir()
    data = os.urandom(3 * 1024 * 1024 + 7)
    src = save(data, p / "step_1.bin")
    rec = mirror(p / "step_1.bin", m)
    assert (m / "step_1.bin").read_bytes() == data
    assert (rec.size, rec.sha256, rec.source) == (src.size, src.sha256, str(p / "step_1.bin"))
    assert read_record(m, "step_1.bin") == rec
    assert not (m / "step_1.bin.part").exists()
    found = latest(m, verify_hash=True)
    assert found is not None and found.step == 1
    with pytest.raises(ValueError):
        mirror(p / "step_1.bin", p)


def test_mirror_refuses_a_truncated_or_corrupt_source(tmp_path: Path) -> None:
    p, m = tmp_path / "p", tmp_path / "m"
    p.mkdir()
    m.mkdir()
    save(os.urandom(10_000), p / "step_1.bin")
    os.truncate(p / "step_1.bin", 7300)
    with pytest.raises(CheckpointError, match="7300 bytes but its record says 10000"):
        mirror(p / "step_1.bin", m)
    save(os.urandom(10_000), p / "step_2.bin")
    with open(p / "step_2.bin", "r+b") as f:
        f.write(b"\0\0\0\0")
    with pytest.raises(CheckpointError, match="SHA-256"):
        mirror(p / "step_2.bin", m)
    assert os.listdir(m) == []
    # without hashing, the copy lands and carries the primary's hash for the exporter to check
    rec = mirror(p / "step_2.bin", m, verify_hash=False)
    assert rec.sha256 == read_record(p, "step_2.bin").sha256  # type: ignore[union-attr]
    assert latest(m) is not None and latest(m, verify_hash=True) is None


def test_mirror_of_an_unrecorded_file_hashes_the_copy(tmp_path: Path) -> None:
    p, m = tmp_path / "p", tmp_path / "m"
    p.mkdir()
    m.mkdir()
    data = os.urandom(1000)
    (p / "step_1.bin").write_bytes(data)
    rec = mirror(p / "step_1.bin", m)
    assert (rec.size, rec.sha256) == (1000, sha(data))


def test_mirror_refuses_a_link_or_a_fifo_as_its_source(tmp_path: Path) -> None:
    """A source that is not a regular file is refused by name: never followed, never waited on
    (a FIFO opened for reading would block until a writer came)."""
    p, m = tmp_path / "p", tmp_path / "m"
    p.mkdir()
    m.mkdir()
    save(b"x" * 100, p / "step_1.bin")
    (p / "step_2.bin").symlink_to(p / "step_1.bin")
    os.mkfifo(p / "step_3.bin")
    link = re.escape(f"{p / 'step_2.bin'}: is a symbolic link; refused")
    with pytest.raises(CheckpointError, match=link):
        mirror(p / "step_2.bin", m)
    fifo = re.escape(f"{p / 'step_3.bin'}: not a regular file; refused")
    with pytest.raises(CheckpointError, match=fifo):
        mirror(p / "step_3.bin", m)
    assert os.listdir(m) == []


@pytest.mark.parametrize("broken", ["copy_file_range", "copy_file_range+sendfile"])
def test_mirror_falls_back_when_the_kernel_cannot_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broken: str
) -> None:
    def exdev(*args: object) -> int:
        raise OSError(errno.EXDEV, "cross-device")

    for name in broken.split("+"):
        monkeypatch.setattr(os, name, exdev)
    monkeypatch.setattr(transfer, "COPY_CHUNK", 1 << 20)
    p, m = tmp_path / "p", tmp_path / "m"
    p.mkdir()
    m.mkdir()
    data = os.urandom(20 * 1024 * 1024 + 3)
    save(data, p / "step_1.bin")
    mirror(p / "step_1.bin", m)
    assert (m / "step_1.bin").read_bytes() == data


def make_steps(d: Path, steps: list[int], *, old: float = 1000.0) -> None:
    d.mkdir(exist_ok=True)
    for s in steps:
        save(f"step {s}".encode(), d / f"step_{s}.bin")
        age(d / f"step_{s}.bin", old)
        age(record_path(d, f"step_{s}.bin"), old)


def names(d: Path) -> list[str]:
    return sorted(n for n in os.listdir(d) if n != MANIFEST_DIR)


def test_prune_keeps_the_newest_and_aligns_mirrors(tmp_path: Path) -> None:
    p, m = tmp_path / "p", tmp_path / "m"
    make_steps(p, [1, 2, 3, 4, 5])
    m.mkdir()
    for s in [1, 2, 3, 4]:
        mirror(p / f"step_{s}.bin", m)
        age(m / f"step_{s}.bin", 1000)
    deleted = prune(p, keep=2, mirrors=[m])
    assert sorted(deleted) == sorted(
        [
            p / "step_1.bin",
            p / "step_2.bin",
            p / "step_3.bin",
            m / "step_1.bin",
            m / "step_2.bin",
            m / "step_3.bin",
        ]
    )
    assert names(p) == ["step_4.bin", "step_5.bin"]
    assert names(m) == ["step_4.bin"]
    assert sorted(os.listdir(p / MANIFEST_DIR)) == ["step_4.bin.json", "step_5.bin.json"]
    assert prune(p, keep=2, mirrors=[m]) == []


def test_prune_never_deletes_what_is_unknown_recent_partial_or_newest(tmp_path: Path) -> None:
    p = tmp_path / "p"
    make_steps(p, [1, 2, 3, 4, 5, 6])
    os.utime(p / "step_1.bin", ns=(0, 0))  # NFS said mtime 0: unknown is not old
    age(p / "step_2.bin", 10)  # touched within the grace period: maybe being copied
    (p / "step_3.bin.part").write_bytes(b"in flight")
    age(p / "step_3.bin.part", 1000)
    deleted = prune(p, keep=1)
    assert sorted(deleted) == [p / "step_3.bin", p / "step_4.bin", p / "step_5.bin"]
    assert names(p) == ["step_1.bin", "step_2.bin", "step_3.bin.part", "step_6.bin"]


def test_prune_deletes_nothing_without_enough_complete_checkpoints(tmp_path: Path) -> None:
    p = tmp_path / "p"
    make_steps(p, [1, 2, 3])
    os.truncate(p / "step_3.bin", 2)  # the newest is truncated: step 2 is the newest complete
    (p / "step_4.bin").write_bytes(b"unrecorded")
    age(p / "step_4.bin", 1000)
    assert prune(p, keep=3) == []
    assert prune(p, keep=2) == []  # 1 and 2 are the two newest complete ones
    # never the newest complete one of a mirror, even when it lags behind the primary
    m = tmp_path / "m"
    make_steps(m, [1])
    assert sorted(prune(p, keep=1, mirrors=[m])) == [p / "step_1.bin"]
    assert names(p) == ["step_2.bin", "step_3.bin", "step_4.bin"]
    assert names(m) == ["step_1.bin"]
    with pytest.raises(ValueError):
        prune(p, keep=0)


def test_prune_skips_a_file_being_read_by_a_copy(tmp_path: Path) -> None:
    p = tmp_path / "p"
    make_steps(p, [1, 2, 3])
    with open(p / "step_1.bin", "rb") as reader:
        fcntl.flock(reader, fcntl.LOCK_SH)  # what mirror() holds on its source
        assert prune(p, keep=1) == [p / "step_2.bin"]
    assert prune(p, keep=1) == [p / "step_1.bin"]


def test_prune_refuses_a_bad_location_before_deleting_anything(tmp_path: Path) -> None:
    p, m = tmp_path / "p", tmp_path / "m"
    make_steps(p, [1, 2])
    m.mkdir()
    (m / MANIFEST_DIR).mkdir()
    (m / MANIFEST_DIR / "step_1.bin.json").write_text("{not json")
    with pytest.raises(Exception, match="not a JSON record"):
        prune(p, keep=1, mirrors=[m])
    assert names(p) == ["step_1.bin", "step_2.bin"]


def test_prune_cleans_orphan_records_and_temporaries(tmp_path: Path) -> None:
    p = tmp_path / "p"
    make_steps(p, [1, 2])
    write_record(p, Record("step_9.bin", 9, 1, None, 1.0))  # its file is gone
    age(record_path(p, "step_9.bin"), 1000)
    tmp = p / MANIFEST_DIR / ".step_3.bin.dead.tmp"
    tmp.write_text("{")
    age(tmp, 1000)
    save(b"other pattern", p / "ckpt-3.bin", pattern="ckpt-{step}")
    age(record_path(p, "ckpt-3.bin"), 1000)
    prune(p, keep=2)
    assert sorted(os.listdir(p / MANIFEST_DIR)) == [
        "ckpt-3.bin.json",  # its file exists: not an orphan, whatever the pattern
        "step_1.bin.json",
        "step_2.bin.json",
    ]


def test_latest_needs_a_matching_record(tmp_path: Path) -> None:
    p = tmp_path / "p"
    make_steps(p, [1, 2, 3, 4])
    os.truncate(p / "step_4.bin", 1)
    (p / "step_5.bin").write_bytes(b"no record")
    os.utime(p / "step_3.bin", ns=(0, 0))  # unknown is never complete
    with open(p / "step_2.bin", "r+b") as f:
        f.write(b"X")  # same size, other bytes
    assert latest(p).step == 2  # type: ignore[union-attr]
    assert latest(p, verify_hash=True).step == 1  # type: ignore[union-attr]
    (tmp_path / "empty").mkdir()
    assert latest(tmp_path / "empty") is None
    with pytest.raises(FileNotFoundError):  # a missing mount is not "start from scratch"
        latest(tmp_path / "missing")


def test_latest_of_a_mirror_without_records_uses_the_primary(tmp_path: Path) -> None:
    p, m = tmp_path / "p", tmp_path / "m"
    make_steps(p, [1, 2])
    m.mkdir()
    (m / "step_1.bin").write_bytes((p / "step_1.bin").read_bytes())
    (m / "step_2.bin").write_bytes(b"st")  # a copy cut short
    assert latest(m) is None
    assert latest(m, primary=p).step == 1  # type: ignore[union-attr]
    # a primary without records: its file's size, once it has settled
    q, n = tmp_path / "q", tmp_path / "n"
    q.mkdir()
    n.mkdir()
    (q / "step_7.bin").write_bytes(b"1234")
    (n / "step_7.bin").write_bytes(b"1234")
    assert latest(n, primary=q) is None  # the primary may still be being written
    age(q / "step_7.bin", 1000)
    assert latest(n, primary=q).step == 7  # type: ignore[union-attr]


def test_latest_never_returns_a_mirror_copy_smaller_than_the_settled_primary(
    tmp_path: Path,
) -> None:
    """The field report scaled down (2.47 GB primary, 1.82 GB mirror copy of the same step): a
    copy taken while the unrecorded primary was still being written carries a record of its own
    short size, and must not be returned once the primary has settled larger."""
    p, m = tmp_path / "p", tmp_path / "m"
    p.mkdir()
    m.mkdir()
    (p / "step_1.bin").write_bytes(os.urandom(1820))
    mirror(p / "step_1.bin", m)
    with open(p / "step_1.bin", "ab") as f:
        f.write(os.urandom(650))
    age(p / "step_1.bin", 1000)
    age(m / "step_1.bin", 1000)
    assert latest(m, primary=p) is None
