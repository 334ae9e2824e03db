"""A corrupt checkpoint stays known as corrupt across an exporter restart (issue 27, case 3).

Through the real exporter: a checkpoint whose content no longer hashes to its record is found
corrupt, the exporter is stopped and started again with a read rate so low that hashing the
file again would take hours, and its first scrape must already say ``hash_mismatch_files 1``.
The same restart with ``verify_cache: off`` shows what happened before the cache: the file
reads as pending and ``hash_mismatch_files 0``, which resolved CheckpointHashMismatch.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from helpers.exporter_proc import Exporter, Samples, poll, value
from trainguard.checkpoint import save

RUN = "r"
#: larger than the verifier's burst (4 MiB), so that at 1 KiB/s the file cannot be hashed again
#: while the test looks
SIZE = 6 << 20


def _config(tmp_path: Path, p: Path, rate: str, cache: str) -> Path:
    cfg = tmp_path / f"tg-{rate}-{cache.replace('/', '_')}.yml"
    cfg.write_text(
        f"runs:\n  - name: {RUN}\n    checkpoints:\n      primary: {p}\n"
        f"checkpoints: {{grace_period: 1s, verify_rate: {rate}, verify_cache: {cache}}}\n"
    )
    return cfg


def _ck(s: Samples, name: str) -> float | None:
    return value(s, f"trainguard_checkpoint_{name}", run=RUN, location="primary")


def _corrupt_checkpoint(p: Path) -> None:
    p.mkdir()
    save(os.urandom(SIZE), p / "step_1.pt")
    with open(p / "step_1.pt", "r+b") as f:  # same size, other bytes
        f.seek(SIZE // 2)
        f.write(b"\0" * 64)
    old = time.time() - 600  # past the grace period
    os.utime(p / "step_1.pt", (old, old))


def _found_corrupt(tmp_path: Path) -> tuple[Path, Path]:
    """A corrupt checkpoint that a first exporter found so and saved: (its directory, cache)."""
    p = tmp_path / "ckpt"
    _corrupt_checkpoint(p)
    cache = tmp_path / "cache" / "verified.json"
    with Exporter(
        args=[f"--config.file={_config(tmp_path, p, '100MiB', str(cache))}"], state_dir=tmp_path
    ) as exp:
        poll(exp, lambda s: _ck(s, "hash_mismatch_files") == 1)
        # saved at once for a mismatch
        poll(exp, lambda s: cache.exists())
    return p, cache


def test_a_known_mismatch_survives_a_restart(tmp_path: Path) -> None:
    p, cache = _found_corrupt(tmp_path)
    saved = json.loads(cache.read_text())
    assert [row[6] for row in saved["verdicts"]] == ["mismatch"]
    assert cache.stat().st_mode & 0o777 == 0o600

    slow = _config(tmp_path, p, "1KiB", str(cache))
    with Exporter(args=[f"--config.file={slow}"], state_dir=tmp_path) as exp:
        s = exp.scrape()
        assert _ck(s, "hash_mismatch_files") == 1
        assert _ck(s, "hash_pending_files") == 0
        assert _ck(s, "last_step") is None

    # before the cache (and with it switched off): a restart forgets, the file is pending again
    off = _config(tmp_path, p, "1KiB", "off")
    with Exporter(args=[f"--config.file={off}"], state_dir=tmp_path) as exp:
        s = exp.scrape()
        assert _ck(s, "hash_mismatch_files") == 0
        assert _ck(s, "hash_pending_files") == 1


def test_a_cache_others_can_write_is_not_trusted(tmp_path: Path) -> None:
    """A verdict file writable by others could hide a corrupt checkpoint: it is ignored (and
    said so), and the file is hashed again."""
    p, cache = _found_corrupt(tmp_path)
    cache.chmod(0o666)
    slow = _config(tmp_path, p, "1KiB", str(cache))
    exp = Exporter(args=[f"--config.file={slow}"], state_dir=tmp_path)
    try:
        s = exp.scrape()
        assert _ck(s, "hash_pending_files") == 1
        assert _ck(s, "hash_mismatch_files") == 0
    finally:
        log = exp.stop()
    assert "writable by nobody else" in log, log


def test_a_damaged_cache_is_said_and_ignored(tmp_path: Path) -> None:
    p = tmp_path / "ckpt"
    _corrupt_checkpoint(p)
    cache = tmp_path / "verified.json"
    cache.write_text('{"format": 1, "verdicts": [[1, 2, 3, 4, 5, "nothex", "match", "/x"]]}')
    cache.chmod(0o600)
    exp = Exporter(
        args=[f"--config.file={_config(tmp_path, p, '100MiB', str(cache))}"], state_dir=tmp_path
    )
    try:
        poll(exp, lambda s: _ck(s, "hash_mismatch_files") == 1)
    finally:
        log = exp.stop()
    assert "field 'verdicts[0]'" in log, log
