"""The background hash verifier: rate-limited, once per unchanged file, forgets deleted files,
never keeps the process alive."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.exporter_proc import child_env
from helpers.wait import wait_for
from trainguard.exporter.collectors.checkpoints import verifier
from trainguard.exporter.collectors.checkpoints.verifier import Status, TokenBucket, Verifier


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> bool:
        self.slept.append(seconds)
        self.now += seconds
        return True


def test_token_bucket_holds_the_long_run_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(100.0, 50.0, clock=clock, sleep=clock.sleep)
    start = clock.now
    for _ in range(20):
        bucket.take(30)  # 600 bytes: 50 of burst, then 550 at 100/s
    bucket.take(0)  # pays off the last debt
    assert clock.now - start == pytest.approx(5.5)
    # idle time refills only up to the burst
    clock.now += 1000
    clock.slept.clear()
    bucket.take(50)
    bucket.take(0)
    assert clock.slept == []
    with pytest.raises(ValueError):
        TokenBucket(0, 1)


def wait_status(v: Verifier, path: Path, expected: str, timeout: float = 60.0) -> Status:
    """The verifier's answer for ``path`` once it is no longer pending."""

    def answered() -> Status | None:
        status, _ = v.status(path, os.stat(path), expected)
        return None if status == "pending" else status

    return wait_for(answered, timeout, 0.02, f"{path} verified")


def test_match_mismatch_and_changed_files(tmp_path: Path) -> None:
    v = Verifier(1e9)
    try:
        f = tmp_path / "step_1.bin"
        data = os.urandom(100_000)
        f.write_bytes(data)
        good = hashlib.sha256(data).hexdigest()
        assert wait_status(v, f, good) == "match"
        assert wait_status(v, f, "0" * 64) == "mismatch"
        read = v.bytes_read
        assert v.status(f, os.stat(f), good) == ("match", "")
        assert v.bytes_read == read  # an unchanged file is hashed once
        with open(f, "r+b") as fh:
            fh.write(b"\0" * 8)
        assert wait_status(v, f, good) == "mismatch"  # same size, new mtime: hashed again
    finally:
        v.stop()


def test_reads_are_rate_limited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's reads go through its token bucket, here on a clock that only its sleeps
    move: the time it waited is exact, whatever the machine's load."""
    clock = FakeClock()
    real_bucket = verifier.TokenBucket

    def bucket(rate: float, burst: float, **_: object) -> TokenBucket:
        return real_bucket(rate, burst, clock=clock, sleep=clock.sleep)

    monkeypatch.setattr(verifier, "TokenBucket", bucket)
    rate = 8 * 1024 * 1024
    f = tmp_path / "step_1.bin"
    f.write_bytes(os.urandom(3 * rate))
    v = Verifier(rate)
    try:
        assert wait_status(v, f, "0" * 64) == "mismatch"
    finally:
        v.stop()
    # one second of burst, then 8 MiB/s: 2 s of waiting for 24 MiB
    assert v.bytes_read == 3 * rate
    assert sum(clock.slept) == pytest.approx(2.0)


def test_deleted_and_unasked_files_are_forgotten(tmp_path: Path) -> None:
    clock = FakeClock()
    v = Verifier(1e9, ttl_seconds=60, clock=clock)
    try:
        files = []
        for i in range(50):
            f = tmp_path / f"step_{i}.bin"
            f.write_bytes(os.urandom(1000))
            files.append(f)
            wait_status(v, f, "0" * 64)
        assert len(v) == 50
        for f in files[10:]:
            f.unlink()
        clock.now += 30
        for f in files[:10]:
            v.status(f, os.stat(f), "0" * 64)  # still there, still asked about by scrapes
        clock.now += 31
        v.sweep()
        assert len(v) == 10
        # a file deleted while queued is dropped by the worker itself
        gone = tmp_path / "gone.bin"
        gone.write_bytes(b"x")
        st = os.stat(gone)
        gone.unlink()
        v.status(gone, st, "0" * 64)
        wait_for(lambda: len(v) <= 10, 60, 0.02, "the deleted file dropped")
        assert len(v) == 10
    finally:
        v.stop()


def test_unreadable_files_are_an_error_not_a_mismatch(tmp_path: Path) -> None:
    v = Verifier(1e9)
    try:
        d = tmp_path / "step_1.bin"
        d.mkdir()  # reading a directory fails: EISDIR
        status = wait_status(v, d, "0" * 64)
        assert status == "error"
        assert v.status(d, os.stat(d), "0" * 64)[1]
    finally:
        v.stop()


def test_the_worker_never_keeps_the_process_alive(tmp_path: Path) -> None:
    f = tmp_path / "big.bin"
    f.write_bytes(os.urandom(4 * 1024 * 1024))
    code = (
        "import os, sys; from pathlib import Path\n"
        "from trainguard.exporter.collectors.checkpoints.verifier import Verifier\n"
        f"p = Path({str(f)!r}); v = Verifier(1024)\n"  # 1 KiB/s: hours for this file
        "v.status(p, os.stat(p), '0' * 64)\n"
        "print('leaving', flush=True)\n"
    )
    # a worker that kept the process alive would read for an hour: the timeout would expire
    r = subprocess.run(
        [sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr


def test_small_files_cost_their_size_not_a_whole_chunk(tmp_path: Path) -> None:
    """Thousands of small checkpoints must not stay 'hash pending' for minutes: each read is
    charged what it can return, so 500 files of 4 KiB cost 2 MiB of the rate."""
    rate = 1024 * 1024  # 1 MiB/s: 500 whole-chunk charges would take half an hour
    v = Verifier(rate)
    try:
        files = []
        for i in range(500):
            f = tmp_path / f"step_{i}.bin"
            data = os.urandom(4096)
            f.write_bytes(data)
            files.append((f, hashlib.sha256(data).hexdigest()))
        pending = files

        def matched() -> bool:
            nonlocal pending
            pending = [(f, h) for f, h in pending if v.status(f, os.stat(f), h)[0] != "match"]
            return not pending

        # whole-chunk charges would take half an hour
        wait_for(matched, 120, what=lambda: f"every file matched; {len(pending)} not")
        assert pending == []
        assert v.bytes_read == 500 * 4096
    finally:
        v.stop()
