"""Who is slow, the training side: ``Run.step(data_seconds=, compute_seconds=)`` reaches the
exporter's counters from a real process; the Lightning and Hugging Face callbacks measure a
rank's wait for data and its compute before the backward (not its wait in the gradient
all-reduce, which with DDP is what makes every rank's steps equally long), with the real
libraries on CPU; bad durations are dropped and logged once; the heartbeat's ``timing`` is
checked like every field."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from helpers.exporter_proc import Exporter, child_env, poll, value
from trainguard.run.reporter import Run
from trainguard.shared.heartbeat.read import parse_heartbeat, read_heartbeat
from trainguard.shared.heartbeat.record import HeartbeatError, Timing, heartbeat_filename

CHILD = r"""
import sys
import trainguard

with trainguard.Run("timed", state_dir=sys.argv[1], interval=0.02) as run:
    for i in range(1, 11):
        run.step(i, data_seconds=0.25, compute_seconds=1.5, loss=1.0 / i)
"""

#: what the callbacks' test models spend per step (seconds, by sleeping)
DATA_SLEEP = 0.004  # per sample; 4 samples a batch
COMPUTE_SLEEP = 0.03  # in the forward
ALLREDUCE_SLEEP = 0.2  # after the backward: a rank waiting for the others in the all-reduce


def heartbeat(state: Path, run: str) -> Any:
    return read_heartbeat(state / heartbeat_filename(run, 0))


def test_step_durations_reach_the_exporter_as_counters(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(state)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    k = {"run": "timed", "rank": "0"}
    with Exporter(state_dir=state) as exp:
        s = poll(exp, lambda s: value(s, "trainguard_run_timed_steps_total", **k) == 10)
    assert value(s, "trainguard_run_data_wait_seconds_total", **k) == pytest.approx(2.5)
    assert value(s, "trainguard_run_compute_seconds_total", **k) == pytest.approx(15.0)
    assert value(s, "trainguard_run_scalar", name="loss", **k) == pytest.approx(0.1)
    # the durations are not scalars
    assert value(s, "trainguard_run_scalar", name="data_seconds", **k) is None


def test_bad_durations_are_dropped_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.WARNING, logger="trainguard.reporter"),
        Run("bad", state_dir=tmp_path, interval=0.02) as run,
    ):
        run.step(1)  # no durations: no timing at all yet
        for bad in (-1.0, float("nan"), "0.1", True):
            run.step(2, data_seconds=bad, compute_seconds=0.5)
        run.step(3, compute_seconds=0.5)  # data not measured: 0
        run.step(4, data_seconds=0.125)
    assert heartbeat(tmp_path, "bad").timing == Timing(0.125, 0.5, 2)
    warnings = [r.getMessage() for r in caplog.records if "data_seconds" in r.getMessage()]
    assert len(warnings) == 1 and "finite number of seconds" in warnings[0]


def test_a_run_without_durations_has_no_timing(tmp_path: Path) -> None:
    with Run("plain", state_dir=tmp_path, interval=0.02) as run:
        run.step(1, loss=0.5)
    hb = heartbeat(tmp_path, "plain")
    assert hb.timing is None
    assert "timing" not in hb.to_dict()


DOC = {
    "format": 1,
    "run": "r",
    "rank": 0,
    "pid": 1,
    "create_time": 1.0,
    "started": 1.0,
    "time": 2.0,
}


@pytest.mark.parametrize(
    ("timing", "field"),
    [
        ([1, 2, 3], "timing"),
        ({"data_seconds": -1, "compute_seconds": 0, "steps": 0}, "timing.data_seconds"),
        ({"data_seconds": 0, "compute_seconds": "1", "steps": 0}, "timing.compute_seconds"),
        ({"data_seconds": 0, "compute_seconds": 1e300, "steps": 0}, "timing.compute_seconds"),
        ({"data_seconds": 0, "compute_seconds": 0, "steps": 1.5}, "timing.steps"),
        ({"data_seconds": 0, "compute_seconds": 0}, "timing.steps"),
    ],
)
def test_the_reader_checks_timing_and_names_the_field(timing: Any, field: str) -> None:
    with pytest.raises(HeartbeatError, match=f"field '{field}'"):
        parse_heartbeat({**DOC, "timing": timing})
    good = {"data_seconds": 1, "compute_seconds": 2.5, "steps": 3}
    assert parse_heartbeat({**DOC, "timing": good}).timing == Timing(1.0, 2.5, 3)


# ----------------------------------------------------------------------- the callbacks


class SlowData:
    """A map-style dataset whose every sample takes DATA_SLEEP to load."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        time.sleep(DATA_SLEEP)
        return self.items[i]


def check_split(timing: Timing | None, steps: int, wall: float) -> None:
    """Data wait and compute were measured, and the all-reduce's wait is in neither.

    ``wall``: the training loop's time, from its first step's start to the last one's end.
    """
    assert timing is not None and timing.steps == steps
    # the first step's wait (the loader starting) is not measured: steps - 1 waits
    assert timing.data_seconds >= (steps - 1) * 4 * DATA_SLEEP
    assert timing.compute_seconds >= steps * COMPUTE_SLEEP
    # what was measured lies outside the all-reduce's sleeps (whatever the machine's load)
    assert timing.data_seconds + timing.compute_seconds <= wall - steps * ALLREDUCE_SLEEP


class Wall:
    """The training loop's wall time, between two hooks."""

    def __init__(self) -> None:
        self.start = self.end = 0.0

    def begin(self, *_: Any, **__: Any) -> None:
        self.start = time.perf_counter()

    def finish(self, *_: Any, **__: Any) -> None:
        self.end = time.perf_counter()

    @property
    def seconds(self) -> float:
        return self.end - self.start


def test_lightning_callback_measures_data_wait_and_compute(tmp_path: Path) -> None:
    L = pytest.importorskip("lightning")
    import torch
    from torch.utils.data import DataLoader

    from trainguard.integrations.lightning import TrainguardCallback

    class Module(L.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            time.sleep(COMPUTE_SLEEP)
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def on_after_backward(self) -> None:
            time.sleep(ALLREDUCE_SLEEP)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    wall = Wall()

    class WallClock(L.Callback):  # type: ignore[misc]
        on_train_start = staticmethod(wall.begin)
        on_train_end = staticmethod(wall.finish)

    torch.manual_seed(0)
    x = torch.randn(32, 4)
    callback = TrainguardCallback("lit", state_dir=tmp_path / "state", interval=0.05)
    trainer = L.Trainer(
        default_root_dir=tmp_path,
        max_steps=6,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[WallClock(), callback],
    )
    data = DataLoader(SlowData(list(zip(x, x.sum(dim=1, keepdim=True), strict=True))), batch_size=4)
    trainer.fit(Module(), data)
    check_split(heartbeat(tmp_path / "state", "lit").timing, 6, wall.seconds)


def test_hugging_face_callback_measures_data_wait_and_compute(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    import torch
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from trainguard.integrations.transformers import TrainguardCallback

    wall = Wall()

    class AllReduce(TrainerCallback):  # type: ignore[misc]
        on_train_begin = staticmethod(wall.begin)
        on_train_end = staticmethod(wall.finish)

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            time.sleep(ALLREDUCE_SLEEP)

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=32, n_positions=8, n_embd=8, n_layer=1, n_head=2)
    tokens = torch.randint(0, config.vocab_size, (64, 8))
    model = GPT2LMHeadModel(config)
    # a slow forward (a hook registered before the callback's runs before its end mark)
    model.register_forward_hook(lambda *_: time.sleep(COMPUTE_SLEEP))
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=6,
        save_strategy="no",
        logging_steps=1000,
        per_device_train_batch_size=4,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=SlowData([{"input_ids": t, "labels": t} for t in tokens]),
        callbacks=[
            TrainguardCallback("hf", state_dir=tmp_path / "state", interval=0.05),
            AllReduce(),
        ],
    )
    trainer.train()
    check_split(heartbeat(tmp_path / "state", "hf").timing, 6, wall.seconds)
