"""Every command of alerts/runbook.md that asks the exporter something is run, as written, against
a real exporter watching a run named as in the runbook (llama-ft): each must print what it is
meant to confirm. They grepped for ``{run="llama-ft"`` while the exporter writes labels sorted
(``rank``, ``location`` or ``device`` first), so six of them printed nothing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest

from helpers.exporter_proc import REPO, Exporter, poll, select
from helpers.nvml_fake import GIB, FakeNvmlState
from helpers.run_child import own_heartbeat, put
from trainguard.exporter.collectors.restore.result import Result, write_result
from trainguard.shared.heartbeat.record import AllocatorStats, Death, Stuck

RUNBOOK = REPO / "alerts" / "runbook.md"
UUID = "GPU-7b000000-0000-0000-0000-000000000000"
#: what the runbook's commands ask the exporter: curl of its default address
EXPORTER_COMMAND = re.compile(r"^curl -s localhost:9636/\S*.*$", re.MULTILINE)


def runbook_commands() -> list[str]:
    text = RUNBOOK.read_text(encoding="utf-8")
    blocks = re.findall(r"```sh\n(.*?)```", text, re.DOTALL)
    return [m.group(0) for block in blocks for m in EXPORTER_COMMAND.finditer(block)]


def test_the_runbook_has_exporter_commands() -> None:
    # the parametrised test below must not pass by finding nothing
    assert len(runbook_commands()) >= 12


@pytest.fixture(scope="module")
def exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exporter]:
    """llama-ft alive at step 1800 on a GPU that reported an Xid, one recorded death (step
    1700), a complete checkpoint of step 1750 and a save in progress."""
    from trainguard import checkpoint

    tmp = tmp_path_factory.mktemp("runbook")
    state, ckpt = tmp / "state", tmp / "ckpt"
    state.mkdir()
    ckpt.mkdir()
    checkpoint.save(os.urandom(1 << 16), ckpt / "step_1750.pt")
    (ckpt / "step_1800.pt.part").write_bytes(b"half")
    nvml = FakeNvmlState()
    nvml.add_gpu(UUID, used=12 * GIB)
    nvml.add_process(0, os.getpid(), 11 * GIB)
    nvml.add_xid(0, 79)
    nvml_path = nvml.write(tmp / "nvml.state")
    config = tmp / "trainguard.yml"
    config.write_text(
        f"runs:\n  - name: llama-ft\n    checkpoints: {{primary: {ckpt}}}\n"
        "checkpoints: {grace_period: 1s}\n",
        encoding="utf-8",
    )
    now = time.time()
    death = Death(step=1700, time=now - 900, detected=now - 600, cause="unknown")
    stats = AllocatorStats(
        device=0,
        allocated_bytes=8 * GIB,
        reserved_bytes=10 * GIB,
        max_allocated_bytes=9 * GIB,
        inactive_split_bytes=GIB,
        alloc_retries=0,
        ooms=0,
        uuid=UUID,
        total_bytes=80 * GIB,
    )
    put(
        state,
        own_heartbeat(
            "llama-ft",
            step=1800,
            deaths=1,
            death_history=(death,),
            allocator=(stats,),
            stuck=Stuck(now - 60, "train.py:88 load_batch <- train.py:120 main"),
        ),
    )
    # a restore drill that loaded step 1750 (trainguard verify --restore)
    write_result(
        state,
        Result(
            path=str(ckpt),
            run="llama-ft",
            location="primary",
            time=now - 300,
            ok=True,
            reason="restore OK",
            checkpoint="step_1750.pt",
            step=1750,
            verified_step=1750,
            verified_time=now - 300,
            verified_checkpoint="step_1750.pt",
        ),
    )
    exp = Exporter(args=[f"--config.file={config}"], env=nvml.env(nvml_path), state_dir=state)
    try:
        poll(
            exp,
            lambda s: (
                bool(select(s, "trainguard_checkpoint_last_step", run="llama-ft"))
                and bool(select(s, "trainguard_gpu_xid_errors_total"))
                and bool(select(s, "trainguard_checkpoint_restore_verified_step"))
            ),
        )
        yield exp
    finally:
        exp.stop()


@pytest.mark.skipif(shutil.which("curl") is None, reason="the runbook's commands use curl")
@pytest.mark.parametrize("command", runbook_commands())
def test_runbook_command_prints_what_it_confirms(exporter: Exporter, command: str) -> None:
    run = command.replace("localhost:9636", f"127.0.0.1:{exporter.port}")
    result = subprocess.run(
        ["bash", "-o", "pipefail", "-c", run], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"{command}\n{result.stderr}"
    lines = result.stdout.strip().splitlines()
    assert lines, f"prints nothing: {command}"
    # it prints what it names: the run of the runbook, where the command is about one run
    if "llama-ft" in command:
        assert all('run="llama-ft"' in line for line in lines), lines
