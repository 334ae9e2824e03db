"""The framework callbacks' parts that need no framework: ``import trainguard`` never loads
transformers or lightning, a missing framework names the extra to install, the run's name, the
scalars taken from a framework's logs, and a run's life (finish, failure, failure at exit)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.exporter_proc import child_env
from trainguard.integrations._common import RunLife, as_float, run_name, scalars_from
from trainguard.shared.heartbeat.read import read_heartbeat

FRAMEWORKS = (
    "transformers",
    "lightning",
    "pytorch_lightning",
    "accelerate",
    "torch",
    "jax",
    "jaxlib",
    "orbax",
    "deepspeed",
)


def child(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        env=child_env(env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_import_trainguard_loads_no_framework() -> None:
    out = child(
        "import json, sys, trainguard, trainguard.integrations\n"
        "trainguard.Run\n"
        "import trainguard.integrations._common\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout)
    leaked = [m for m in loaded if m.split(".")[0] in FRAMEWORKS]
    assert leaked == []


@pytest.mark.parametrize("module", ["transformers", "lightning"])
def test_a_missing_framework_names_the_extra_to_install(module: str) -> None:
    # sys.modules[name] = None makes `import name` fail as if it were not installed
    out = child(
        f"import sys\nsys.modules[{module!r}] = None\nimport trainguard.integrations.{module}\n"
    )
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: trainguard.integrations.")
    assert f"needs {module}" in last and f"pip install 'trainguard[{module}]'" in last


def test_the_run_name(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TRAINGUARD_RUN", raising=False)
    assert run_name(None, None, str(tmp_path / "llama-ft")) == "llama-ft"
    assert run_name(None, "sweep-3", str(tmp_path / "out")) == "sweep-3"
    assert run_name(None, str(tmp_path / "a" / "b") + "/", None) == "b"  # a path as run_name
    assert run_name(None, None, None) == "train"
    monkeypatch.setenv("TRAINGUARD_RUN", "launched")  # trainguard launch --name launched
    assert run_name(None, "sweep-3", str(tmp_path)) == "launched"
    assert run_name("explicit", "sweep-3", str(tmp_path)) == "explicit"


def test_scalars_from_framework_logs() -> None:
    hf_step = {"loss": 3.5, "grad_norm": 0.7, "learning_rate": 1e-4, "epoch": 0.25}
    assert scalars_from(hf_step) == {"loss": 3.5, "grad_norm": 0.7, "lr": 1e-4, "epoch": 0.25}
    hf_end = {
        "train_runtime": 16.1,
        "train_samples_per_second": 14.9,
        "train_steps_per_second": 1.9,
        "train_loss": 3.9,  # the mean over the whole run: not the loss now
        "total_flos": 1e9,
    }
    assert scalars_from(hf_end) == {"samples_per_s": 14.9, "steps_per_s": 1.9}
    assert scalars_from({"train/loss": 2.0, "train/tokens_per_sec": 5e4, "note": "x"}) == {
        "loss": 2.0,
        "tokens_per_s": 5e4,
    }
    assert scalars_from({"loss": "low", "lr": True}) == {}
    assert as_float(3) == 3.0 and as_float(None) is None


def test_tokens_per_second_from_the_tokens_seen(tmp_path: Path) -> None:
    life = RunLife({"state_dir": tmp_path})
    life.log({"num_input_tokens_seen": 1000})
    assert "tokens_per_s" not in life._scalars  # one reading is no rate
    life.log({"num_input_tokens_seen": 3000, "loss": 1.0})
    assert life._scalars["tokens_per_s"] > 0 and life._scalars["loss"] == 1.0


def test_a_run_life_finishes_fails_and_starts_again(tmp_path: Path) -> None:
    life = RunLife({"state_dir": tmp_path, "interval": 0.05})
    run = life.start("life", 3, tmp_path / "out", "checkpoint-{step}")
    assert life.start("life", 3, None, None) is run  # a second start while open: the same
    life.log({"loss": 2.0})
    life.step(7)
    life.finish()
    hb = read_heartbeat(run.path)
    assert (hb.state, hb.step, hb.rank, hb.scalars["loss"]) == ("finished", 7, 3, 2.0)
    assert (hb.checkpoint_dir, hb.checkpoint_pattern) == (
        str(tmp_path / "out"),
        "checkpoint-{step}",
    )
    again = life.start("life", 3, None, "ignored-{step}")  # a second train(): a new Run
    assert again is not run
    life.fail(MemoryError("x"))
    hb = read_heartbeat(again.path)
    assert (hb.state, hb.error, hb.checkpoint_pattern) == ("failed", "MemoryError", None)
    assert hb.deaths == 0  # the same process: no death


@pytest.mark.parametrize(
    ("ending", "state", "error"),
    [
        ("pass", "failed", None),  # train() raised, the script caught it and exited normally
        ("raise KeyError('k')", "failed", "KeyError"),  # uncaught
        ("life.finish()", "finished", None),
    ],
)
def test_a_process_leaving_before_training_ended_records_a_failure(
    tmp_path: Path, ending: str, state: str, error: str | None
) -> None:
    out = child(
        "from trainguard.integrations._common import RunLife\n"
        f"life = RunLife({{'state_dir': {str(tmp_path)!r}}})\n"
        "run = life.start('leaving', 0, None, None)\n"
        "life.step(4)\n"
        f"print(run.path, flush=True)\n{ending}\n"
    )
    hb = read_heartbeat(Path(out.stdout.strip()))
    assert (hb.state, hb.error, hb.step) == (state, error, 4)
