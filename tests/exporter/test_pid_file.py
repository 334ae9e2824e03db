"""A configured run's pid file is read as untrusted: a FIFO cannot hang a scrape, and a symbolic
link is followed only to a file its owner owns (docs/metrics.md, configured runs)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from helpers.exporter_proc import Exporter, Samples


def sample(samples: Samples, metric: str, **labels: str) -> float | None:
    return samples.get((metric, frozenset(labels.items())))


def test_fifo_and_symlinked_pid_files(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    runner = subprocess.Popen(["sleep", "60"])
    try:
        fifo = tmp_path / "fifo.pid"
        os.mkfifo(fifo)  # nothing ever writes it: a plain open() waits for a writer for ever
        own = real / "own.pid"
        own.write_text(f"{runner.pid}\n")
        own_link = tmp_path / "own-link.pid"
        own_link.symlink_to(own)  # a service that links its pid file elsewhere
        if os.geteuid() == 0:  # another user's file holding a live pid
            foreign = real / "foreign.pid"
            foreign.write_text(f"{runner.pid}\n")
            os.chown(foreign, 65534, 65534)
        else:  # a file of root's, as big as a private file would be
            foreign = Path("/etc/passwd")
        foreign_link = tmp_path / "foreign-link.pid"
        foreign_link.symlink_to(foreign)
        dangling = tmp_path / "dangling.pid"
        dangling.symlink_to(real / "removed-at-exit.pid")
        config = tmp_path / "tg.yml"
        config.write_text(
            f"""
runs:
  - name: fifo
    pid_file: {fifo}
  - name: own-link
    pid_file: {own_link}
  - name: foreign-link
    pid_file: {foreign_link}
  - name: dangling
    pid_file: {dangling}
"""
        )
        state = tmp_path / "state"
        state.mkdir()
        with Exporter(args=[f"--config.file={config}"], state_dir=state) as exp:
            started = time.monotonic()
            s = exp.scrape()
            took = time.monotonic() - started
            s2 = exp.scrape()  # again: nothing is left blocked from the first
            log = exp.stop()
    finally:
        runner.kill()
        runner.wait()

    def up(run: str, samples: Samples = s) -> float | None:
        return sample(samples, "trainguard_run_process_up", run=run, rank="0")

    assert took < 5, took  # well inside the collector's deadline: the FIFO was never waited on
    assert up("own-link") == 1 and up("own-link", s2) == 1
    assert up("fifo") is None  # cannot tell: absent, and the collector says it failed
    assert up("foreign-link") is None
    assert up("dangling") is None  # its file removed: not running, not an error
    for scrape in (s, s2):
        assert sample(scrape, "trainguard_collector_success", collector="runs") == 0
    assert f"pid file {fifo}: not a regular file; refused" in log
    assert f"pid file {foreign_link}: is a symbolic link to {foreign}: owned by uid " in log
    assert "not by the link's owner" in log
    assert "dangling" not in log
