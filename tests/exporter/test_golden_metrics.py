"""The whole /metrics page of the real exporter on a fixed state, against a golden file
(node_exporter's ``e2e-output.txt`` pattern): any change to a metric, a label, a help text or
the order of the page shows as a readable diff of ``tests/data/golden/metrics.txt``.

The state: two GPUs of the test NVML library with a live process of a run, a process that
no longer exists and one whose memory the driver does not know; a live run with a primary
checkpoint location and a mirror (one copy truncated), a run that died; a process count.
What cannot be fixed is normalised before comparing: durations, timestamps, ages, free and
used bytes of the filesystem, pids, the temporary paths and the exporter's own ``process_*``
values; sample lines are compared sorted within their family (pids decide the order of a
GPU's processes).

After an intended change, rewrite the file and review its diff:
``pytest tests/exporter/test_golden_metrics.py --update-golden``
(or ``TRAINGUARD_UPDATE_GOLDEN=1``).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from helpers import paths
from helpers.exporter_proc import Exporter, poll, value
from helpers.nvml_fake import FakeNvmlState
from helpers.settled_checkpoints import write_settled_checkpoints
from trainguard.shared import procinfo
from trainguard.shared.heartbeat.record import (
    AllocatorStats,
    Heartbeat,
    Timing,
    heartbeat_filename,
    write_heartbeat,
)
from trainguard.shared.nonfinite import NonFinite

PROMTOOL = shutil.which("promtool")
GOLDEN = paths.DATA / "golden" / "metrics.txt"
GIB = 1 << 30
AGE = 3600  # checkpoint files are this old: past the grace period, judged at once
PAYLOAD = 4096
UUIDS = ("GPU-11111111-2222-4333-8444-555555555555", "GPU-66666666-7777-4888-9999-aaaaaaaaaaaa")

#: metrics whose value depends on when and where the test runs: (name pattern, why)
VOLATILE = re.compile(
    r"^(process_\w+"  # the exporter process's own memory, CPU, fds, start time
    r"|\w+_duration_seconds"  # how long a collector took
    r"|\w+_timestamp_seconds"  # wall-clock times
    r"|\w+_age_seconds"  # now minus a time
    r"|\w+_filesystem_\w+_bytes"  # the filesystem the test's tmp dir is on
    r")$"
)


def update_requested(config: pytest.Config) -> bool:
    return bool(config.getoption("--update-golden")) or os.environ.get(
        "TRAINGUARD_UPDATE_GOLDEN", ""
    ) not in ("", "0")


def write_checkpoints(directory: Path, steps: list[int], *, mirror_of: Path | None) -> None:
    """Settled checkpoints with their records; a mirror's last copy is cut short."""
    write_settled_checkpoints(directory, steps, mirror_of=mirror_of, age=AGE, payload=PAYLOAD)


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def build_state(tmp: Path, live: list[int], dead: int) -> tuple[dict[str, str], list[str]]:
    """The fixed state under ``tmp``: the exporter's environment and arguments."""
    state = FakeNvmlState(driver_version="550.54.15")
    state.add_gpu(UUIDS[0], used=20 * GIB, total=80 * GIB)
    a100 = state.add_gpu(UUIDS[1], name="NVIDIA A100-SXM4-40GB", used=6 * GIB, total=40 * GIB)
    a100.nvlinks, a100.nvlink_down = 2, 0x2  # link 1 inactive: no series
    a100.nvlink_errors = {(0, "replay"): 3, (1, "crc_flit"): 9}
    state.add_process(0, live[0], 8 * GIB)  # the run's process
    state.add_process(0, dead, 4 * GIB)  # gone: its memory is ghost memory
    state.add_process(1, live[1], 3 * GIB)
    state.add_process(1, live[1], 3 * GIB, kind="graphics")  # in both lists: counted once
    nvml = state.write(tmp / "nvml.state")

    state_dir = tmp / "state"
    state_dir.mkdir()
    now = time.time()
    common = dict(
        host=socket.gethostname(),
        boot_id=procinfo.boot_id(),
        boot_time=procinfo.boot_time(),
        pid_ns=procinfo.pid_namespace(),
    )
    primary, backup = tmp / "ckpt" / "primary", tmp / "ckpt" / "backup"
    write_checkpoints(primary, [100, 200], mirror_of=None)
    write_checkpoints(backup, [100, 200], mirror_of=primary)
    (tmp / "train.log").write_text("step 250\n")
    runs = [
        Heartbeat(
            run="golden",
            rank=0,
            pid=live[0],
            create_time=psutil.Process(live[0]).create_time(),
            started=now - 3600,
            time=now,
            step=250,
            step_time=now,
            scalars={"loss": 0.5},
            nonfinite=NonFinite(counts={"loss": 2, "grad_norm": 0}, loss_streak=0),
            timing=Timing(data_seconds=12.5, compute_seconds=400.0, steps=250),
            world_size=1,
            checkpoint_dir=str(primary),
            mirrors={"backup": str(backup)},
            log_file=str(tmp / "train.log"),
            allocator=(
                AllocatorStats(0, 10 * GIB, 12 * GIB, 11 * GIB, 1 << 20, 1, 0, UUIDS[0], 80 * GIB),
            ),
            **common,  # type: ignore[arg-type]
        ),
        Heartbeat(
            run="crashed",
            rank=0,
            pid=dead,
            create_time=now - 7200,
            started=now - 7200,
            time=now - 600,
            step=42,
            step_time=now - 600,
            world_size=1,
            **common,  # type: ignore[arg-type]
        ),
    ]
    for hb in runs:
        write_heartbeat(state_dir / heartbeat_filename(hb.run, hb.rank), hb)
    config = tmp / "trainguard.yml"
    config.write_text(
        "process_counts:\n"
        "  - name: nothing\n"
        '    match: "^trainguard-golden-no-such-process$"\n'
        "checkpoints:\n"
        "  verify_rate: 1000000000000\n"
    )
    return FakeNvmlState().env(nvml), [f"--config.file={config}", f"--state.dir={state_dir}"]


def normalise(text: str, tmp: Path, pids: dict[int, str]) -> str:
    """Volatile values as ``<v>``, pids by role, paths under the test's directory as
    ``<tmp>``, the host's name as ``<host>``; sample lines sorted within their family."""
    text = text.replace(str(tmp), "<tmp>")
    text = text.replace(f'host="{socket.gethostname()}"', 'host="<host>"')
    out: list[str] = []
    block: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            out.extend(sorted(block))
            block = []
            out.append(line)
            continue
        series, _, val = line.rpartition(" ")
        name = series.split("{", 1)[0]
        series = re.sub(r'pid="(\d+)"', lambda m: f'pid="{pids.get(int(m[1]), "<pid>")}"', series)
        block.append(f"{series} {'<v>' if VOLATILE.match(name) else val}")
    out.extend(sorted(block))
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """One settled scrape of the fixed state: the page as served, and normalised."""
    tmp = tmp_path_factory.mktemp("golden")
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
    try:
        live = [p.pid for p in sleepers]
        dead = dead_pid()
        env, args = build_state(tmp, live, dead)
        with Exporter(args, env=env) as exp:
            # settled: the verifier has hashed every file
            pending = "trainguard_checkpoint_hash_pending_files"
            poll(
                exp,
                lambda s: all(
                    value(s, pending, run="golden", location=where) == 0
                    for where in ("primary", "backup")
                ),
            )
            page = exp.get()
        pids = {live[0]: "<run golden>", live[1]: "<other live>", dead: "<dead>"}
        yield page, normalise(page, tmp, pids)
    finally:
        for p in sleepers:
            p.kill()
            p.wait()


def test_metrics_page_matches_the_golden_file(
    scraped: tuple[str, str], request: pytest.FixtureRequest
) -> None:
    got = scraped[1]
    if update_requested(request.config):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(got)
        pytest.skip(f"rewrote {GOLDEN}: review its diff")
    assert GOLDEN.exists(), f"no {GOLDEN}: run with --update-golden to write it"
    assert got == GOLDEN.read_text(), (
        "the /metrics page changed; if intended, rerun with --update-golden and review the diff"
    )


#: what ``promtool check metrics`` says about the page today, each a decision of its own:
#: renaming trainguard_process_count would break the shipped rules and dashboards
KNOWN_LINTS = {
    'trainguard_process_count non-histogram and non-summary metrics should not have "_count" suffix'
}


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")
def test_promtool_checks_the_page(scraped: tuple[str, str]) -> None:
    """The page as served parses, and promtool's linter finds nothing new."""
    assert PROMTOOL is not None
    out = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=scraped[0], capture_output=True, text=True
    )
    problems = {line.strip() for line in (out.stdout + out.stderr).splitlines() if line.strip()}
    assert problems - KNOWN_LINTS == set(), out
    assert out.returncode in (0, 3), out  # 3: lint problems only (the known ones)
