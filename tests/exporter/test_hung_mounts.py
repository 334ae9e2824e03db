"""A dead network filesystem under the state directory and under a checkpoint location, as a
real FUSE mount whose calls block in the kernel until told to answer (helpers/hangfs.py): the
scrape answers by its one deadline, taken from Prometheus's scrape-timeout header, with every
healthy collector's series and the two hung collectors at success 0; a hung collector is not
called again while its call hangs (the exporter's thread count stays put over 50 scrapes) and
its error is logged once; when the mount answers again, everything comes back.

Mounting needs /dev/fuse and the right to mount (root, or fusermount); where mounting is
refused the test is skipped, saying why."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import TracebackType

import pytest
import yaml

from helpers import paths
from helpers.exporter_proc import Exporter, Samples, parse_samples, poll, select, value
from helpers.nvml_fake import GIB, FakeNvmlState
from helpers.run_child import own_heartbeat, put
from trainguard.exporter.collectors import COLLECTORS
from trainguard.exporter.http.app import client_timeout

HANGFS = paths.HELPERS / "hangfs.py"
UUID = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
#: Prometheus's default scrape_timeout, sent as its header: the scrape's deadline is 9.5 s
HEADER = "10"
#: the client waits longer than the deadline but not as long as --collector.timeout below: a
#: scrape that ignored the header, or waited for its collectors one after another, fails here
CLIENT_TIMEOUT = 30.0


class HangFS:
    """helpers/hangfs.py mirroring ``backing`` at ``mountpoint``, driven over its stdin."""

    def __init__(self, backing: Path, mountpoint: Path, log: Path) -> None:
        self.mountpoint = mountpoint
        self.log = log
        with open(log, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(HANGFS), str(backing), str(mountpoint)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        assert self.proc.stdout is not None
        said = self.proc.stdout.readline().strip()
        if said != "mounted":
            self.close()
            why = log.read_text(errors="replace").strip()
            if "Unable to find libfuse" in why or "No module named 'fuse'" in why:
                pytest.fail(f"fusepy and libfuse2 are test dependencies (./run-tests): {why}")
            pytest.skip(f"cannot mount a FUSE filesystem here: {said or why}")

    def _say(self, command: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == command  # taken before we go on

    def hang(self) -> None:
        self._say("hang")

    def answer(self) -> None:
        if self.proc.poll() is None:
            self._say("answer")

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()  # it answers what still waits, then unmounts
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.mountpoint.is_mount():
            subprocess.run(["umount", "-l", str(self.mountpoint)], check=False)

    def __enter__(self) -> HangFS:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def scrape(exp: Exporter) -> Samples:
    """One scrape as Prometheus makes it, with its scrape timeout in the header."""
    req = urllib.request.Request(
        exp.url + "/metrics", headers={"X-Prometheus-Scrape-Timeout-Seconds": HEADER}
    )
    with urllib.request.urlopen(req, timeout=CLIENT_TIMEOUT) as r:
        return parse_samples(r.read().decode())


def success(s: Samples, collector: str) -> float | None:
    return value(s, "trainguard_collector_success", collector=collector)


def threads(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def test_a_dead_mount_costs_its_collectors_not_the_scrape(tmp_path: Path) -> None:
    backing = tmp_path / "nfs"
    (backing / "state").mkdir(parents=True)
    (backing / "ckpt").mkdir()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    # this process is the run: alive, on the GPU with 2 GiB
    put(backing / "state", own_heartbeat("r"))
    gpu = FakeNvmlState()
    gpu.add_gpu(UUID, used=3 * GIB)
    gpu.add_process(0, os.getpid(), 2 * GIB)
    nvml = gpu.write(tmp_path / "nvml.state")
    config = tmp_path / "trainguard.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "runs": [
                    {
                        "name": "cfg",
                        "cmdline_match": "no-such-process-[0-9]{40}",
                        "checkpoints": {"primary": str(mnt / "ckpt")},
                    }
                ],
                "process_counts": [{"name": "py", "match": "python"}],
            }
        )
    )
    log = tmp_path / "exporter.log"
    with (
        HangFS(backing, mnt, tmp_path / "hangfs.log") as fs,
        Exporter(
            args=[f"--config.file={config}", "--collector.timeout=60s"],
            env=gpu.env(nvml),
            state_dir=mnt / "state",
            log_path=log,
        ) as exp,
    ):
        try:
            before = scrape(exp)
            for name in ("gpu", "processes", "runs", "checkpoints"):
                assert success(before, name) == 1, (name, exp.log())
            assert value(before, "trainguard_run_step", run="r", rank="0") == 5
            assert select(before, "trainguard_gpu_process_memory_used_bytes", run="r")

            fs.hang()
            hung = [scrape(exp)]
            baseline = threads(exp.proc.pid)
            counts = []
            for _ in range(50):
                hung.append(scrape(exp))
                counts.append(threads(exp.proc.pid))
            for s in hung:
                # the healthy: all the processes collector has, the GPU's devices
                assert success(s, "processes") == 1
                assert (value(s, "trainguard_process_count", name="py") or 0) >= 1
                assert value(s, "trainguard_gpu_memory_used_bytes", gpu="0", uuid=UUID) == (3 * GIB)
                # ...whose processes cannot be told apart as a run's or no run's while the
                # runs are unknown: none said to be either, and the collector at 0
                assert not select(s, "trainguard_gpu_process_memory_used_bytes")
                assert success(s, "gpu") == 0
                # the hung: at 0, none of their series
                assert success(s, "runs") == 0
                assert success(s, "checkpoints") == 0
                assert not select(s, "trainguard_run_step")
                assert not select(s, "trainguard_checkpoint_location_up")
            # one outstanding call per collector and per shared read: no thread per scrape
            # (a request's thread may not have ended yet when the next count is taken)
            assert max(counts) <= baseline + 2, (baseline, counts)
            text = exp.log()
            assert text.count("collector checkpoints: did not finish") == 1, text
            assert text.count("collector runs: reading the state directory") == 1, text
            assert text.count("collector gpu: processes not attributed to runs") == 1, text
        finally:
            fs.answer()

        back = poll(exp, lambda s: all(success(s, c.name) == 1 for c in COLLECTORS))
        assert value(back, "trainguard_run_step", run="r", rank="0") == 5
        assert value(back, "trainguard_checkpoint_location_up", run="cfg", location="primary")
        assert select(back, "trainguard_gpu_process_memory_used_bytes", run="r")
        assert "collector checkpoints recovered" in exp.log()


def test_the_scrape_timeout_header() -> None:
    """Prometheus's scrape timeout less half a second for the answer to travel (at least half
    of it); a header that is missing or not a positive number leaves --collector.timeout."""
    assert client_timeout("10") == 9.5
    assert client_timeout("0.6") == 0.3
    for bad in (None, "", "soon", "0", "-3", "nan", "inf"):
        assert client_timeout(bad) is None, bad
