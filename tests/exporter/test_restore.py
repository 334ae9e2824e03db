"""``trainguard verify --restore``: real checkpoints loaded in a real child, the result exported.

Each case writes a checkpoint as training does (``trainguard.checkpoint.save``, torch's DCP,
a Hugging Face layout), damages it where the case says, runs the command as a user does and
checks its exit status and the file its message names. The last case reads the result the
drill leaves through a real exporter's /metrics.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from helpers.exporter_proc import EXPORTER_SRC, Exporter, child_env, poll, value
from trainguard import checkpoint
from trainguard.exporter.collectors.restore.result import SUFFIX, read_result

CMD = [sys.executable, "-m", "trainguard.exporter.terminal", "verify", "--restore"]
#: a drill of a small checkpoint takes seconds (importing torch); a hang would take this long
DEADLINE = 180


class Custom:
    """An object ``torch.load(weights_only=True)`` refuses to unpickle."""

    def __init__(self) -> None:
        self.lr = 0.1


def drill(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CMD, "--grace", "0", *map(str, args)],
        env=child_env(env),
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )


def says(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stdout + proc.stderr


def weights(n: int = 64) -> dict[str, torch.Tensor]:
    return {"layer.weight": torch.arange(n * n, dtype=torch.float32).reshape(n, n)}


def test_a_good_checkpoint_loads_and_leaves_a_result(tmp_path: Path) -> None:
    loc, state = tmp_path / "ckpt", tmp_path / "state"
    loc.mkdir()
    checkpoint.save(weights(), loc / "step_100.pt")
    checkpoint.save({**weights(), "step": 200, "optimizer": {"lr": 0.1}}, loc / "step_200.pt")
    proc = drill(loc, "--state.dir", state, "--run", "llama")
    assert proc.returncode == 0, says(proc)
    assert proc.stdout.startswith("restore OK: step 200 (step_200.pt) loads: 1 files"), says(proc)
    (result_file,) = (state / "restore").glob("*" + SUFFIX)
    result = read_result(result_file)
    assert (result.ok, result.run, result.step, result.verified_step) == (True, "llama", 200, 200)
    assert result.path == str(loc)


def test_a_truncated_checkpoint_fails_naming_the_file(tmp_path: Path) -> None:
    """Cut short after it was recorded (verify sees it) and cut short before (only a load can)."""
    loc = tmp_path / "ckpt"
    loc.mkdir()
    checkpoint.save(weights(), loc / "step_100.pt")
    whole = (loc / "step_100.pt").read_bytes()
    checkpoint.save(weights(), loc / "step_200.pt")
    os.truncate(loc / "step_200.pt", len(whole) // 2)
    proc = drill(loc / "step_200.pt", "--no-result")
    assert proc.returncode == 1, says(proc)
    assert "restore FAILED: step 200" in proc.stdout
    assert "step_200.pt: " in proc.stdout and "truncated" in proc.stdout, says(proc)
    # the location as a whole: a resume would load step 100, which loads
    proc = drill(loc, "--no-result")
    assert proc.returncode == 0, says(proc)
    assert "step 100" in proc.stdout and "newer step_200.pt is truncated" in proc.stdout
    # recorded as written, cut short already: verify calls it complete, the load does not
    checkpoint.save(whole[: len(whole) - 200], loc / "step_300.pt")
    listed = subprocess.run(
        [sys.executable, "-m", "trainguard.exporter.terminal", "verify", "--grace", "0", loc],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert listed.returncode == 0, says(listed)  # complete by its record
    proc = drill(loc, "--no-result")
    assert proc.returncode == 1, says(proc)
    assert "step 300 (step_300.pt): step_300.pt: " in proc.stdout, says(proc)


def test_a_pickled_object_that_weights_only_refuses(tmp_path: Path) -> None:
    loc = tmp_path / "ckpt"
    loc.mkdir()
    checkpoint.save({**weights(), "hparams": Custom()}, loc / "step_100.pt")
    proc = drill(loc, "--no-result")
    assert proc.returncode == 1, says(proc)
    assert "step_100.pt: torch.load(weights_only=True) refused it" in proc.stdout, says(proc)
    assert "Custom" in proc.stdout


def _dcp_save(directory: Path) -> None:
    import torch.distributed.checkpoint as dcp

    state = {"a": torch.ones(300), "b": torch.zeros(200), "c": torch.arange(7), "meta": [1, "x"]}
    with warnings.catch_warnings():  # no process group: the single-process save, as intended
        warnings.simplefilter("ignore")
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(directory), thread_count=3))


def test_a_dcp_checkpoint_with_a_missing_shard(tmp_path: Path) -> None:
    loc = tmp_path / "ckpt"
    _dcp_save(loc / "step_100")
    _dcp_save(loc / "step_200")
    shards = sorted((loc / "step_200").glob("*.distcp"))
    assert len(shards) == 3
    proc = drill(loc, "--no-result")
    assert proc.returncode == 0, says(proc)
    assert "restore OK: step 200 (step_200/) loads: 4 files" in proc.stdout, says(proc)
    shards[1].unlink()
    proc = drill(loc, "--no-result")
    assert proc.returncode == 1, says(proc)
    assert f"step_200/{shards[1].name}: missing (named in .metadata" in proc.stdout, says(proc)
    # a shard cut short is told apart too
    os.truncate(shards[0], 10)
    proc = drill(loc / "step_200", "--no-result")
    assert proc.returncode == 1 and f"step_200/{shards[0].name}: 10 bytes" in proc.stdout


def _hf_checkpoint(directory: Path, step: int) -> None:
    from safetensors.torch import save_file

    directory.mkdir(parents=True)
    save_file(weights(), str(directory / "model.safetensors"))
    (directory / "config.json").write_text('{"model_type": "gpt2"}')
    torch.save({"state": {}, "param_groups": [{"lr": 0.1}]}, directory / "optimizer.pt")
    state = {"global_step": step, "log_history": [{"loss": 1.5, "step": step}]}
    (directory / "trainer_state.json").write_text(json.dumps(state, indent=2) + "\n")


def test_a_hugging_face_checkpoint_with_a_truncated_model(tmp_path: Path) -> None:
    step = tmp_path / "out" / "checkpoint-500"
    _hf_checkpoint(step, 500)
    proc = drill(step, "--no-result")  # its name gives the pattern: no --pattern needed
    assert proc.returncode == 0, says(proc)
    assert "restore OK: step 500 (checkpoint-500/) loads: 4 files" in proc.stdout, says(proc)
    model = step / "model.safetensors"
    os.truncate(model, model.stat().st_size - 100)
    proc = drill(step, "--no-result")
    assert proc.returncode == 1, says(proc)
    assert "checkpoint-500/model.safetensors: " in proc.stdout, says(proc)
    assert "truncated" in proc.stdout


def test_without_torch_says_what_it_could_not_check(tmp_path: Path) -> None:
    """An install without torch: safetensors are still checked, a torch file is not."""
    shadow = tmp_path / "no-torch"
    (shadow / "torch").mkdir(parents=True)
    (shadow / "torch" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n"
    )
    env = {"PYTHONPATH": os.pathsep.join([str(EXPORTER_SRC), str(shadow)])}
    step = tmp_path / "out" / "checkpoint-500"
    _hf_checkpoint(step, 500)
    proc = drill(step, "--no-result", env=env)
    assert proc.returncode == 3, says(proc)
    assert "restore NOT CHECKED" in proc.stdout and "checkpoint-500/optimizer.pt" in proc.stdout
    assert "torch is not installed" in proc.stdout
    (step / "optimizer.pt").unlink()
    proc = drill(step, "--no-result", env=env)
    assert proc.returncode == 0, says(proc)


@pytest.mark.slow
def test_the_memory_cap_fails_a_load_that_needs_more(tmp_path: Path) -> None:
    """Under the same cap a small checkpoint loads and a 512 MiB one fails, with a message."""
    loc = tmp_path / "ckpt"
    loc.mkdir()
    checkpoint.save(weights(), loc / "step_100.pt")
    cap = "800MiB"  # importing CPU torch maps about 600 MiB
    proc = drill(loc / "step_100.pt", "--no-result", "--memory-limit", cap)
    assert proc.returncode == 0, says(proc)
    checkpoint.save({"big": torch.zeros(128 * 2**20)}, loc / "step_200.pt")  # 512 MiB
    proc = drill(loc / "step_200.pt", "--no-result", "--memory-limit", cap)
    assert proc.returncode == 1, says(proc)
    assert proc.stdout.startswith("restore FAILED: step 200 (step_200.pt): "), says(proc)
    assert "memory" in proc.stdout, says(proc)


def test_the_result_reaches_the_exporter(tmp_path: Path) -> None:
    """Named by --run, and by path (the config file's location); a failed drill keeps the step."""
    named, declared, state = tmp_path / "named", tmp_path / "declared", tmp_path / "state"
    named.mkdir()
    declared.mkdir()
    checkpoint.save(weights(), named / "step_100.pt")
    checkpoint.save(weights(), declared / "step_7.pt")
    assert drill(named, "--state.dir", state, "--run", "llama").returncode == 0
    assert drill(declared, "--state.dir", state).returncode == 0
    config = tmp_path / "tg.yml"
    config.write_text(f"runs:\n  - name: declared-run\n    checkpoints: {{primary: {declared}}}\n")
    m = "trainguard_checkpoint_restore_"
    with Exporter(["--no-collector.gpu", f"--config.file={config}"], state_dir=state) as exp:
        s = poll(exp, lambda s: value(s, m + "verified_step", run="llama", location="primary"))
        assert value(s, m + "verified_step", run="llama", location="primary") == 100
        assert value(s, m + "last_check_success", run="llama", location="primary") == 1
        assert value(s, m + "verified_step", run="declared-run", location="primary") == 7
        when = value(s, m + "verified_timestamp_seconds", run="llama", location="primary")
        assert when is not None and abs(when - (named / "step_100.pt").stat().st_mtime) < 600
        assert value(s, "trainguard_collector_success", collector="restore") == 1
        # the checkpoint is damaged: the next drill fails, the verified step stays
        (named / "step_100.pt").write_bytes(b"not a checkpoint")
        assert drill(named / "step_100.pt", "--state.dir", state, "--run", "llama").returncode
        s = poll(
            exp, lambda s: value(s, m + "last_check_success", run="llama", location="primary") == 0
        )
        assert value(s, m + "last_check_success", run="llama", location="primary") == 0
        assert value(s, m + "verified_step", run="llama", location="primary") == 100
        # the ages on the exporter's clock: the failed drill is newer than the verified one
        checked = value(s, m + "last_check_age_seconds", run="llama", location="primary")
        verified = value(s, m + "verified_age_seconds", run="llama", location="primary")
        assert checked is not None and verified is not None and 0 <= checked <= verified
