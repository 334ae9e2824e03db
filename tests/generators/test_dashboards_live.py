"""Every dashboard panel's and variable's query, run against a real Prometheus that scrapes
the real exporter (test NVML, real training children with checkpoints and a mirror, a death,
a run with allocator stats): each must be valid PromQL and return data."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from helpers.dashboard_queries import iter_queries
from helpers.e2e_stack import GIB, Stack
from helpers.exporter_proc import child_env
from helpers.paths import REPO
from helpers.promstack import needs_stack
from helpers.run_child import heartbeat_path, own_heartbeat, put, wait_heartbeat
from helpers.tmpfs import try_mount, unmount
from helpers.wait import wait_for
from trainguard import checkpoint
from trainguard.checkpoint import outcomes
from trainguard.exporter.collectors.restore.result import Result, write_result
from trainguard.run.allocator import allocator_stats
from trainguard.shared.heartbeat.record import SnapshotRecord, SnapshotState, Stuck

pytestmark = [
    pytest.mark.slow,
    needs_stack,
]

CUDA_STATS = {
    "allocated_bytes.all.current": 6 * GIB,
    "allocated_bytes.all.peak": 9 * GIB,
    "reserved_bytes.all.current": 8 * GIB,
    "inactive_split_bytes.all.current": 1 * GIB,
    "num_alloc_retries": 2,
    "num_ooms": 1,
}


#: the one panel that shows data only while a volume fills up: its query needs free space that
#: goes down, so the test fills a volume of its own (a tmpfs), which nothing else writes to
FILLING_QUERY = "-deriv(trainguard_checkpoint_filesystem_avail_bytes"
#: the panel that shows data only while a rank leaks: the minimum of its allocated bytes over
#: minutes must grow for minutes, longer than this test runs; its query is still run (valid
#: PromQL), and promtool tests cover AllocatorMemoryLeak's same expression with data
LEAKING_QUERY = "(deriv(min_over_time(trainguard_run_allocator_allocated_bytes{"


class Filler(threading.Thread):
    """Fills a volume slowly and steadily, so that its free space only ever goes down."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.done = threading.Event()

    def run(self) -> None:
        with open(self.path, "ab") as f:
            while not self.done.wait(0.25):
                f.write(b"\0" * (32 << 10))  # 128 KiB/s: minutes before 256 MiB are full
                f.flush()


def test_every_dashboard_query_returns_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt, mirror = tmp_path / "ckpt", tmp_path / "mirror"
    log = tmp_path / "train.log"
    volume = tmp_path / "volume"
    own_volume = try_mount(volume, "256m") is None
    (volume / "ckpt").mkdir()
    filler = Filler(volume / "filler")
    filler.start()
    try:
        stack = Stack(
            tmp_path,
            config_yaml=(
                "process_counts:\n  - {name: sleepers, match: '^sleep$'}\n"
                "runs:\n"
                "  - name: toy\n"
                f"    log_file: {log}\n"
                "  - name: filling\n"
                f"    checkpoints: {{primary: {volume / 'ckpt'}}}\n"
                "checkpoints: {grace_period: 1s}\n"
            ),
        )
    except BaseException:
        filler.done.set()
        filler.join()
        unmount(volume)
        raise
    sleeper = subprocess.Popen(["sleep", "300"])
    children: list[subprocess.Popen[bytes]] = []
    try:
        # a run whose heartbeat carries CUDA allocator stats (recorded with torch's key names)
        # and its device's GPU UUID (torch's spelling), which joins it to GPU 0
        put(
            stack.state_dir,
            own_heartbeat(
                "cuda-sim",
                pid=sleeper.pid,
                create_time=psutil.Process(sleeper.pid).create_time(),
                allocator=(
                    allocator_stats(
                        0, CUDA_STATS, "e2e00000-0000-0000-0000-000000000000", total=80 * GIB
                    ),
                ),
                memory_snapshots=1,
                # its step overdue: where its main thread waits (the stuck ranks' table)
                stuck=Stuck(time.time(), "all_reduce <- train.py:40 step", "all_reduce"),
                snapshots=SnapshotState(
                    counts={"oom": 1, "periodic": 3, "requested": 0},
                    failures={},
                    history=True,
                    requests=True,
                    recent=(
                        SnapshotRecord(
                            "cuda-sim-x.rank0.oom-1.pickle", "oom", 42, time.time(), 1 << 20
                        ),
                    ),
                ),
            ),
        )
        # a rank up without a first step yet (the "Up without a first step" panel)
        put(
            stack.state_dir,
            own_heartbeat(
                "no-step",
                pid=sleeper.pid,
                create_time=psutil.Process(sleeper.pid).create_time(),
                step=None,
                step_time=None,
            ),
        )
        stack.nvml.add_process(0, sleeper.pid, 12 * GIB)
        # a second GPU where one process's memory is not available (WDDM): its unattributed
        # memory is unknown, while GPU 0 still has a value
        gpu1 = stack.nvml.add_gpu("GPU-e2e00001-0000-0000-0000-000000000000", used=3 * GIB)
        # GPU 1 is older than Ampere (it retires pages, no row remapping), GPU 0 has NVLink
        # links: the retired-pages and NVLink panels have series (GPU 0 the remapped rows')
        gpu1.page_retirement, gpu1.retired_sbe, gpu1.retired_dbe = True, 2, 1
        stack.nvml.gpus[0].nvlinks = 2
        stack.nvml.gpus[0].nvlink_errors = {(0, "replay"): 3, (1, "crc_flit"): 1}
        stack.nvml.add_process(1, 4_000_000, None, kind="graphics")
        stack.nvml.gpus[0].used += 12 * GIB
        stack.nvml.add_xid(1, 94)  # a contained ECC error on GPU 1
        stack.nvml.write(stack.nvml_path)
        # the toy example: checkpoints, a mirror, a log
        children.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(REPO / "examples" / "train_toy.py"),
                    "--name=toy",
                    "--steps=100000",
                    "--sleep=0.02",
                    "--checkpoint-every=20",
                    f"--checkpoint-dir={ckpt}",
                    f"--mirror-dir={mirror}",
                    f"--state-dir={stack.state_dir}",
                    f"--log-file={log}",
                ],
                # the checkpoint library records each save's outcome where the exporter reads
                # it (the saves table, time since the last successful save); a Slurm job once
                # requeued: its job and attempt (the job panels)
                env=child_env(
                    {
                        "TRAINGUARD_STATE_DIR": str(stack.state_dir),
                        "SLURM_JOB_ID": "4242",
                        "SLURM_RESTART_COUNT": "1",
                    }
                ),
            )
        )
        (ckpt / "step_999999.pt.part").parent.mkdir(parents=True, exist_ok=True)
        (ckpt / "step_999999.pt.part").write_bytes(b"in flight")
        # a truncated checkpoint of the "filling" run, settled long ago: its damaged step
        damaged = volume / "ckpt" / "step_5.pt"
        checkpoint.save(os.urandom(4096), damaged)
        os.truncate(damaged, 1000)
        os.utime(damaged, (time.time() - 600, time.time() - 600))
        # a failed save into the "filling" run's location, recorded as the checkpoint library
        # records it (the saves table's last failure)
        monkeypatch.setenv("TRAINGUARD_STATE_DIR", str(stack.state_dir))
        outcomes.record_failure(volume / "ckpt", OSError(28, "No space left on device"))
        # a restore drill of the toy's primary whose last check failed after an earlier one
        # loaded step 20 (the restore columns)
        now = time.time()
        write_result(
            stack.state_dir,
            Result(
                path=str(ckpt),
                run="toy",
                location="primary",
                time=now,
                ok=False,
                reason="does not load",
                checkpoint="step_40.pt",
                step=40,
                verified_step=20,
                verified_time=now - 60,
                verified_checkpoint="step_20.pt",
            ),
        )
        # a run that dies twice: deaths, last death step and TrainingProcessDied in ALERTS.
        # Each victim is killed only once its heartbeat on disk carries a step (and the deaths
        # before it): the next victim records the death with that step, which is what the
        # "last death step" panels show; killed before its first step, there is none to show.
        for deaths in range(2):
            victim = stack.start_training("victim")
            # this process's own heartbeat (not the previous one's, still up until the next
            # scrape): the second one has recorded the first one's death by then
            stack.prometheus.wait_until(
                f'trainguard_run_info{{run="victim",pid="{victim.pid}"}}'
                " and on (instance, run, rank) trainguard_run_process_up == 1",
                timeout=60,
            )
            wait_heartbeat(
                heartbeat_path(stack.state_dir, "victim"),
                lambda hb, pid=victim.pid, deaths=deaths: (
                    hb.pid == pid and (hb.step or 0) >= 1 and hb.deaths == deaths
                ),
            )
            stack.kill(victim)
        stack.prometheus.wait_until('ALERTS{alertname="TrainingProcessDied",run="victim"}')
        stack.prometheus.wait_until(  # the toy imports torch first: slow on a busy machine
            'trainguard_checkpoint_last_step{run="toy",location="backup"} > 20', timeout=300
        )

        queries = iter_queries()
        assert len(queries) > 50
        failures: dict[str, str] = {}
        # rates need a few scrapes, and the usual steps/min (a subquery at 1m steps) the next
        # whole minute: up to a minute on any machine, longer on a busy one
        # queries that may rightly show nothing here are run for valid PromQL only, not waited
        # for: the leak's time until full needs many minutes of growth, and on a shared disk
        # whether free space goes down is up to every other process
        exempt = [LEAKING_QUERY] if own_volume else [LEAKING_QUERY, FILLING_QUERY]
        pending = []
        for uid, title, expr in queries:
            if any(q in expr for q in exempt):
                res = stack.prometheus.query(expr)
                if res.get("status") != "success":
                    failures[f"{uid} / {title}: {expr}"] = str(res.get("error"))
            else:
                pending.append((uid, title, expr))

        def answered() -> bool:
            still = []
            for uid, title, expr in pending:
                res = stack.prometheus.query(expr)
                if res.get("status") != "success":
                    failures[f"{uid} / {title}: {expr}"] = str(res.get("error"))
                elif not res["data"]["result"]:
                    still.append((uid, title, expr))
            pending[:] = still
            return not pending

        wait_for(answered, 240, 1, lambda: f"data from every query; none: {pending}; {failures}")
        assert failures == {}, "invalid PromQL"
        assert [f"{u} / {t}: {e}" for u, t, e in pending] == [], "queries without data"
    finally:
        for child in children:
            child.kill()
            child.wait()
        sleeper.kill()
        sleeper.wait()
        stack.close()
        filler.done.set()
        filler.join()
        unmount(volume)
