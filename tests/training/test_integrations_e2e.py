"""The framework callbacks end to end: the real Hugging Face Trainer, Lightning and torchrun on
CPU (tiny models built in the test, nothing downloaded) report through ``TrainguardCallback``
to a real exporter, scraped over HTTP. Gates in the training child (helpers/framework_child.py)
park it at a known step, so that a scrape or a SIGKILL lands mid-training without sleeping."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from helpers.e2e_stack import Stack
from helpers.exporter_proc import REPO, Exporter, Samples, child_env, poll, select, value
from helpers.promstack import needs_stack
from helpers.run_child import sigkill
from helpers.wait import WaitTimeout, wait_for
from helpers.zygote import Forked, Zygote
from trainguard import checkpoint
from trainguard.shared.heartbeat.read import read_heartbeat
from trainguard.shared.manifest import read_all_records
from trainguard.shared.pattern import CheckpointPattern

pytestmark = pytest.mark.slow

CHILD = REPO / "tests" / "helpers" / "framework_child.py"
#: a training child: forked from the fork server (conftest.framework_zygote), or torchrun
Proc = subprocess.Popen[str] | Forked
#: generous: importing a framework on a loaded 2-core machine takes tens of seconds
DEADLINE = 600.0
MAX_STEPS, SAVE_STEPS = 20, 10
#: Lightning's default ModelCheckpoint names (epoch=0-step=10.ckpt), as the child keeps them
LIGHTNING_PATTERN = "epoch={epoch}-step={step}"
ENV = {
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # torchrun shares its rendezvous store with the workers' process group by default, and a
    # restarted group may then read the dead workers' addresses: its gloo connect is refused
    # or hangs (pytorch/pytorch#135712); docs/integrations.md tells torchrun users the same
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
}


@dataclass
class Training:
    framework: str
    out: Path
    state: Path
    gate: Path
    log: Path
    zygote: Zygote | None  # None: only under a launcher

    @property
    def name(self) -> str:  # the callbacks name the run after its output / root directory
        return self.out.name

    def command(self, gate_step: int, *extra: str) -> list[str]:
        return [
            str(CHILD),
            self.framework,
            f"--out={self.out}",
            f"--state-dir={self.state}",
            f"--gate={self.gate}",
            f"--max-steps={MAX_STEPS}",
            f"--save-steps={SAVE_STEPS}",
            f"--gate-step={gate_step}",
            *extra,
        ]

    def start(self, gate_step: int = -1, launcher: list[str] | None = None, *extra: str) -> Proc:
        """The training child; under ``launcher`` (torchrun), a real ``python -m`` process."""
        self.gate.mkdir(parents=True, exist_ok=True)
        with open(self.log, "a") as log:
            if launcher is None:
                assert self.zygote is not None, "a training child without torchrun: the zygote"
                return self.zygote.spawn(
                    self.command(gate_step, *extra),
                    child_env(ENV),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            return subprocess.Popen(
                [sys.executable, *launcher, *self.command(gate_step, *extra)],
                env=child_env(ENV),
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
            )

    def wait_parked(self, proc: Proc, ranks: int = 1) -> list[int]:
        """The pids parked at the gate step, once every rank is there."""
        files = [self.gate / f"parked-rank{r}" for r in range(ranks)]
        wait_until(lambda: all(f.exists() for f in files), proc, self.log, "parked at the gate")
        pids: list[int] = []
        for f in files:
            wait_until(lambda f=f: f.read_text().endswith("\n"), proc, self.log, "pid written")
            pids.append(int(f.read_text()))
        return pids

    def finish(self, proc: Proc) -> None:
        (self.gate / "release").touch()
        try:
            rc = proc.wait(DEADLINE)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"training did not end:\n{tail(self.log)}") from None
        assert rc == 0, tail(self.log)


def tail(log: Path) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-40:])


def wait_until(ok: Callable[[], bool], proc: Proc, log: Path, what: str) -> None:
    """Wait for ``ok``, failing at once if the training process exits first; on a timeout its
    stacks and log say where it stuck."""

    def alive_and_ok() -> bool:
        if ok():
            return True
        if proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode} before {what}:\n{tail(log)}")
        return False

    try:
        wait_for(alive_and_ok, DEADLINE, what=what)
    except WaitTimeout as exc:
        dump_stacks(proc)
        raise AssertionError(f"{exc}:\n{tail(log)}") from None


def dump_stacks(proc: Proc) -> None:
    """Ask the training processes to write their stacks to the log (faulthandler)."""
    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in family:  # a forked child, or torchrun's workers (not torchrun: no faulthandler)
        if (p.pid == proc.pid and isinstance(proc, Forked)) or "framework_child" in " ".join(
            p.cmdline()
        ):
            os.kill(p.pid, signal.SIGUSR1)
    time.sleep(1)  # the dump is asynchronous; only for the failure message


def exporter(t: Training) -> Exporter:
    """The exporter on the run's state dir, calling a checkpoint settled 1 s after its last
    write (the default grace period is minutes)."""
    config = t.state.parent / "trainguard.yml"
    config.write_text("checkpoints: {grace_period: 1s}\n")
    return Exporter([f"--config.file={config}"], state_dir=t.state)


def last_step(s: Samples, t: Training) -> float | None:
    return value(s, "trainguard_checkpoint_last_step", run=t.name, location="primary")


def training(tmp_path: Path, framework: str, zygote: Zygote | None = None) -> Training:
    return Training(
        framework,
        tmp_path / f"{framework}-run",
        tmp_path / "state",
        tmp_path / "gate",
        tmp_path / "train.log",
        zygote,
    )


@dataclass
class Finished:
    training: Training
    exporter: Exporter
    mid: Samples  # scraped while parked at step 5
    end: Samples  # scraped after a clean end


@pytest.fixture(scope="module", params=["hf", "lightning"])
def finished(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    framework_zygote: Zygote,
) -> Iterator[Finished]:
    """One clean run per framework, scraped mid-training and at the end (shared by the tests
    below that only read it)."""
    t = training(tmp_path_factory.mktemp(request.param), request.param, framework_zygote)
    t.state.mkdir(parents=True)
    with exporter(t) as exp:
        proc = t.start(gate_step=5)
        try:
            t.wait_parked(proc)
            key = {"run": t.name, "rank": "0"}
            mid = poll(exp, lambda s: value(s, "trainguard_run_step", **key) == 5, DEADLINE)
            t.finish(proc)
            end = poll(exp, lambda s: value(s, "trainguard_run_finished", **key) == 1, DEADLINE)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        yield Finished(t, exp, mid, end)


def test_a_run_is_up_steps_to_max_steps_and_finishes(finished: Finished) -> None:
    key = {"run": finished.training.name, "rank": "0"}
    mid, end = finished.mid, finished.end
    assert value(mid, "trainguard_run_process_up", **key) == 1
    assert value(mid, "trainguard_run_finished", **key) == 0
    assert value(mid, "trainguard_run_step", **key) == 5
    assert value(end, "trainguard_run_process_up", **key) == 0
    assert value(end, "trainguard_run_finished", **key) == 1
    assert value(end, "trainguard_run_step", **key) == MAX_STEPS
    loss = value(end, "trainguard_run_scalar", **key, name="loss")
    assert loss is not None and loss > 0
    assert value(end, "trainguard_run_scalar", **key, name="lr") is not None
    assert value(end, "trainguard_run_deaths_total", run=key["run"]) == 0
    assert value(end, "trainguard_checkpoint_location_up", run=key["run"], location="primary") == 1
    if finished.training.framework == "hf":  # from the logged num_input_tokens_seen
        tokens = value(end, "trainguard_run_scalar", **key, name="tokens_per_s")
        assert tokens is not None and tokens > 0
    if finished.training.framework == "lightning":  # files: seen, by the announced pattern
        files = value(end, "trainguard_checkpoint_files", run=key["run"], location="primary")
        assert files == MAX_STEPS // SAVE_STEPS


def test_the_newest_complete_checkpoint_is_the_last_save_steps_multiple(
    finished: Finished,
) -> None:
    t = finished.training

    def judged(s: Samples) -> bool:
        """The last save settled (1 s grace: until then the one before it is the newest
        complete), or files that will never be complete (no point waiting)."""
        unrecorded = value(
            s, "trainguard_checkpoint_unrecorded_files", run=t.name, location="primary"
        )
        return last_step(s, t) == MAX_STEPS or bool(unrecorded)

    s = poll(finished.exporter, judged, DEADLINE)
    assert last_step(s, t) == MAX_STEPS


@pytest.mark.parametrize("framework", ["hf", "lightning"])
def test_sigkill_mid_training_is_a_death_and_the_restart_counts_it(
    tmp_path: Path, framework: str, framework_zygote: Zygote
) -> None:
    t = training(tmp_path, framework, framework_zygote)
    t.state.mkdir(parents=True)
    key = {"run": t.name, "rank": "0"}
    with exporter(t) as exp:
        first = t.start(gate_step=15)  # a checkpoint at 10, parked at 15
        try:
            (pid,) = t.wait_parked(first)
            alive = poll(exp, lambda s: value(s, "trainguard_run_step", **key) == 15, DEADLINE)
            assert value(alive, "trainguard_run_process_up", **key) == 1
            sigkill(pid)
            dead = exp.scrape()  # the next scrape
            assert value(dead, "trainguard_run_process_up", **key) == 0
            assert value(dead, "trainguard_run_finished", **key) == 0
            assert value(dead, "trainguard_run_step", **key) == 15
            # what a restart resumes from: step 10's directory (hf), epoch=0-step=10.ckpt
            settled = poll(exp, lambda s: last_step(s, t) is not None, DEADLINE)
            assert last_step(settled, t) == 10
        finally:
            if first.poll() is None:
                first.kill()
            first.wait()
        second = t.start()  # resumes from step 10's checkpoint, no gate
        try:
            t.finish(second)
        finally:
            if second.poll() is None:
                second.kill()
                second.wait()
        s = poll(exp, lambda s: value(s, "trainguard_run_finished", **key) == 1, DEADLINE)
        assert value(s, "trainguard_run_deaths_total", run=t.name) == 1
        assert value(s, "trainguard_run_last_death_step", run=t.name) == 15
        assert value(s, "trainguard_run_step", **key) == MAX_STEPS
        s = poll(exp, lambda s: last_step(s, t) == MAX_STEPS, DEADLINE)
        assert last_step(s, t) == MAX_STEPS
        info = select(s, "trainguard_run_info", run=t.name)
        assert [dict(lbl)["pid"] for lbl in info] == [str(second.pid)]


def test_a_lightning_checkpoint_killed_mid_save_is_never_complete_and_fit_resumes_from_latest(
    tmp_path: Path, framework_zygote: Zygote
) -> None:
    """SIGKILL while TrainguardCheckpointIO saves ``epoch=1-step=20.ckpt`` (Lightning's default
    names): the exporter and ``latest`` stay on step 10, and the restart's
    ``fit(ckpt_path=...)`` starts from what ``latest`` returned."""
    t = training(tmp_path, "lightning", framework_zygote)
    t.state.mkdir(parents=True)
    ckpt = t.out / "checkpoints"
    with exporter(t) as exp:
        first = t.start(-1, None, f"--park-in-save-step={MAX_STEPS}")
        try:
            (pid,) = t.wait_parked(first)
            assert list(ckpt.glob(f"epoch=*-step={MAX_STEPS}.ckpt.part"))  # mid-save, for real
            sigkill(pid)
        finally:
            if first.poll() is None:
                first.kill()
            first.wait()
        assert not list(ckpt.glob(f"epoch=*-step={MAX_STEPS}.ckpt"))
        s = poll(exp, lambda s: last_step(s, t) is not None, DEADLINE)
        assert last_step(s, t) == SAVE_STEPS
        found = checkpoint.latest(ckpt, pattern=LIGHTNING_PATTERN, verify_hash=True)
        assert found is not None and found.step == SAVE_STEPS
        assert (t.gate / "resumed").read_text().split() == ["none", "0"]
        second = t.start()
        try:
            t.finish(second)
        finally:
            if second.poll() is None:
                second.kill()
                second.wait()
        assert (t.gate / "resumed").read_text().split() == [str(found.path), str(SAVE_STEPS)]
        s = poll(exp, lambda s: last_step(s, t) == MAX_STEPS, DEADLINE)
        assert last_step(s, t) == MAX_STEPS


def test_an_hf_checkpoint_is_complete_at_once_and_a_truncated_file_in_it_is_caught(
    tmp_path: Path, framework_zygote: Zygote
) -> None:
    """The callback records each ``checkpoint-N`` at the Trainer's ``on_save``: with an hour's
    grace period, the first scrape after the save already has it complete. A
    ``model.safetensors`` cut short afterwards is truncated for the exporter and ``verify``,
    and ``latest`` goes back to the checkpoint before it."""
    t = training(tmp_path, "hf", framework_zygote)
    t.state.mkdir(parents=True)
    config = t.state.parent / "trainguard.yml"
    config.write_text("checkpoints: {grace_period: 1h}\n")  # nothing waits to settle
    pattern = "checkpoint-{step}"
    with Exporter([f"--config.file={config}"], state_dir=t.state) as exp:
        proc = t.start(11, None, "--save-steps=5")  # saved at 5 and 10, parked at 11
        try:
            t.wait_parked(proc)
            s = exp.scrape()  # the first scrape after step 10's on_save
            assert last_step(s, t) == 10, tail(t.log)
            records = read_all_records(t.out)
            assert sorted(records) == ["checkpoint-10", "checkpoint-5"]
            on_disk = sorted(
                str(p.relative_to(t.out / "checkpoint-10"))
                for p in (t.out / "checkpoint-10").rglob("*")
                if p.is_file()
            )
            assert [f[0] for f in records["checkpoint-10"].files or ()] == on_disk
            assert "model.safetensors" in on_disk and "trainer_state.json" in on_disk

            model = t.out / "checkpoint-10" / "model.safetensors"
            size = model.stat().st_size
            with open(model, "r+b") as fh:
                fh.truncate(size // 2)
            then = time.time() - 7200  # cut short a while ago, as when it is noticed
            os.utime(model, (then, then))
            s = exp.scrape()
            where = {"run": t.name, "location": "primary"}
            assert value(s, "trainguard_checkpoint_truncated_files", **where) == 1
            assert last_step(s, t) == 5
            r = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "trainguard.exporter.terminal",
                    "verify",
                    str(t.out),
                    f"--pattern={pattern}",
                    "--json",
                ],
                env=child_env(),
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert r.returncode == 1, r.stdout + r.stderr
            doc = json.loads(r.stdout)
            verdicts = {i["name"]: i["verdict"] for i in doc["items"]}
            assert verdicts["checkpoint-10/"] == "truncated", verdicts
            assert verdicts["checkpoint-5/"] == "complete", verdicts
            assert doc["resume_step"] == 5
            found = checkpoint.latest(t.out, pattern=pattern)
            assert found is not None and found.step == 5
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.mark.parametrize("framework", ["hf", "lightning"])
def test_an_exception_in_training_is_a_failure(
    tmp_path: Path, framework: str, framework_zygote: Zygote
) -> None:
    t = training(tmp_path, framework, framework_zygote)
    proc = t.start(-1, None, "--raise-step=3")
    try:
        assert proc.wait(DEADLINE) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (path,) = t.state.glob("*.heartbeat.json")
    hb = read_heartbeat(path)
    assert (hb.state, hb.error, hb.step) == ("failed", "ValueError", 3), tail(t.log)


TORCHRUN = [
    "-m",
    "torch.distributed.run",
    "--standalone",
    "--nproc-per-node=2",
    "--max-restarts=3",  # a restarted group that fails to connect (gloo) is restarted
    "--monitor-interval=0.1",
]


def stop_torchrun(proc: Proc) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # torchrun stops its workers on SIGTERM
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@needs_stack
def test_a_rank_killed_under_torchrun_pages(tmp_path: Path) -> None:
    """The shipped rules, in a real Prometheus and Alertmanager, page for the run when one of
    its two torchrun ranks is killed (torchrun then stops the other one too): once, for the
    job (torchrun gives the ranks their job identity), naming the rank that was killed."""
    stack = Stack(tmp_path)
    t = training(tmp_path, "hf")
    proc = t.start(5, TORCHRUN)
    try:
        pids = t.wait_parked(proc, ranks=2)
        stack.prometheus.wait_until(
            f'count(trainguard_run_process_up{{run="{t.name}"}} == 1) == 2', timeout=DEADLINE
        )
        sigkill(pids[1])  # the restarted workers wait at the gate: the group stays dead
        _, alert = stack.webhook.wait_for("TrainingJobRankDied", timeout=DEADLINE, run=t.name)
        assert alert["labels"]["severity"] == "critical"
        assert alert["labels"]["job_id"], alert["labels"]
        assert alert["annotations"]["first_rank"] == "1", alert["annotations"]
    finally:
        stop_torchrun(proc)
        stack.close()


def test_lightning_under_torchrun_reports_each_rank(tmp_path: Path) -> None:
    t = training(tmp_path, "lightning")
    t.state.mkdir(parents=True)
    ranks = [{"run": t.name, "rank": str(r)} for r in range(2)]
    with Exporter(state_dir=t.state) as exp:
        proc = t.start(5, TORCHRUN)
        try:
            t.wait_parked(proc, ranks=2)
            s = poll(
                exp,
                lambda s: all(value(s, "trainguard_run_step", **k) == 5 for k in ranks),
                DEADLINE,
            )
            assert [value(s, "trainguard_run_process_up", **k) for k in ranks] == [1, 1]
            t.finish(proc)
            s = poll(
                exp,
                lambda s: all(value(s, "trainguard_run_finished", **k) == 1 for k in ranks),
                DEADLINE,
            )
            assert [value(s, "trainguard_run_step", **k) for k in ranks] == [MAX_STEPS] * 2
        finally:
            stop_torchrun(proc)
    # DDP: rank 0 alone saved, each checkpoint through TrainguardCheckpointIO, recorded
    ckpt = t.out / "checkpoints"
    names = sorted(p.name for p in ckpt.iterdir() if p.name != ".trainguard")
    pattern = CheckpointPattern(LIGHTNING_PATTERN)  # Lightning's default names, whatever epoch
    assert [pattern.step(n) for n in names] == [SAVE_STEPS, MAX_STEPS], names
    assert sorted(read_all_records(ckpt)) == names
    found = checkpoint.latest(ckpt, pattern=LIGHTNING_PATTERN, verify_hash=True)
    assert found is not None and found.step == MAX_STEPS


def test_torchrun_restart_of_the_worker_group_is_a_death_then_a_restart(tmp_path: Path) -> None:
    """Two ranks under real torchrun (gloo, CPU) with the HF callback and nothing else: one
    rank killed, torchrun restarts the group, the new workers record the deaths."""
    t = training(tmp_path, "hf")
    t.state.mkdir(parents=True)
    ranks = [{"run": t.name, "rank": str(r)} for r in range(2)]
    with Exporter(state_dir=t.state) as exp:
        proc = t.start(gate_step=15, launcher=TORCHRUN)
        try:
            before = t.wait_parked(proc, ranks=2)
            s = poll(
                exp,
                lambda s: all(value(s, "trainguard_run_step", **k) == 15 for k in ranks),
                DEADLINE,
            )
            for k in ranks:
                assert value(s, "trainguard_run_process_up", **k) == 1
            for f in t.gate.glob("parked-rank*"):
                f.unlink()
            sigkill(before[1])
            # restarted workers wait for gate/restart: this scrape sees the death, not a race
            s = exp.scrape()
            assert value(s, "trainguard_run_process_up", **ranks[1]) == 0
            assert value(s, "trainguard_run_finished", **ranks[1]) == 0
            (t.gate / "restart").touch()
            after = t.wait_parked(proc, ranks=2)
            assert set(after).isdisjoint(before)
            s = poll(
                exp,
                lambda s: (
                    value(s, "trainguard_run_deaths_total", run=t.name) == 1
                    and all(value(s, "trainguard_run_process_up", **k) == 1 for k in ranks)
                ),
                DEADLINE,
            )
            assert value(s, "trainguard_run_deaths_total", run=t.name) == 1
            assert value(s, "trainguard_run_last_death_step", run=t.name) == 15
            # a restart in place keeps the job id: the death is this job's own (a restart
            # TrainingJobRestarted notifies; a relaunch under a new id would name the old job)
            jobs = {dict(lbl)["job_id"] for lbl in select(s, "trainguard_run_job_info", run=t.name)}
            assert len(jobs) == 1, jobs
            assert select(s, "trainguard_run_last_death_job_info", run=t.name) == {
                frozenset({"run": t.name, "job_id": jobs.pop()}.items()): 1.0
            }
            t.finish(proc)
            s = poll(
                exp,
                lambda s: all(value(s, "trainguard_run_finished", **k) == 1 for k in ranks),
                DEADLINE,
            )
            for k in ranks:
                assert value(s, "trainguard_run_step", **k) == MAX_STEPS
            assert value(s, "trainguard_run_deaths_total", run=t.name) == 1
        finally:
            stop_torchrun(proc)


@pytest.mark.parametrize(
    ("script", "dir_flag", "first", "resumed"),
    [
        ("train_hf.py", "--output-dir", "checkpoint-10", "checkpoint-20"),
        (
            "train_lightning.py",
            "--root",
            "checkpoints/epoch=0-step=10.ckpt",
            "checkpoints/epoch=0-step=20.ckpt",
        ),
    ],
)
def test_the_examples_train_report_and_resume(
    tmp_path: Path,
    script: str,
    dir_flag: str,
    first: str,
    resumed: str,
    framework_zygote: Zygote,
) -> None:
    out, state = tmp_path / "run", tmp_path / "state"

    def example(steps: int, *extra: str) -> str:
        rc, output = framework_zygote.run(
            [
                str(REPO / "examples" / script),
                f"{dir_flag}={out}",
                f"--max-steps={steps}",
                "--save-steps=10",
                f"--state-dir={state}",
                *extra,
            ],
            child_env(ENV),
            DEADLINE,
        )
        assert rc == 0, output
        return output

    assert "resumed from None" in example(10)
    assert (out / first).exists()
    assert f"trained to step 20 (resumed from {out / first})" in example(20, "--resume")
    assert (out / resumed).exists()
    (path,) = state.glob("*.heartbeat.json")
    hb = read_heartbeat(path)
    assert (hb.run, hb.state, hb.step, hb.deaths) == ("run", "finished", 20, 0)
    assert hb.checkpoint_dir == str((out / resumed).parent)
    assert hb.scalars["loss"] > 0
