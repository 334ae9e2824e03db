"""The real DeepSpeed (0.19.8, CPU accelerator, gloo) killed mid-save, ZeRO stages 1 and 2.

Two ranks training a small model, ``engine.save_checkpoint`` after every step; rank 0 SIGKILLed
at a random moment of a save (the first time at one of its file writes), then rank 1; resumed
each time in a fresh world from what ``latest()`` finds (as docs/checkpoints.md says to). After
each kill: every ``global_step<N>`` trainguard's verdict calls complete (auto-detected layout:
steps up to the one named in ``latest``; no grace period) loads with ``engine.load_checkpoint``
in a fresh two-rank world (a copy, loaded at the end) and comes back as that step; a step newer
than ``latest`` is never complete, and so is one ``latest`` names whose files are not whole
(DeepSpeed writes ``latest`` on rank 0 without waiting for the other ranks' files);
``latest()`` and the exporter's ``last_step`` are the newest complete step.

DeepSpeed is not in the test extras (accelerate, transformers and Lightning look for an
installed deepspeed, and the other tests run without one): ``./run-tests`` installs it apart,
with ``pip install --target .deepspeed`` (DS_BUILD_OPS=0: no C++ op is built), and this test
puts that folder on the children's path.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import random
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.exporter_proc import child_env, free_port
from helpers.paths import HELPERS, REPO
from helpers.wait import wait_for
from helpers.zygote import Forked, Zygote
from test_checkpoint_writers import RUN, Scraper, ck, committed_steps
from trainguard.checkpoint import latest
from trainguard.exporter.runs.targets import CheckpointTarget

CHILD = HELPERS / "deepspeed_child.py"
PATTERN = "global_step{step}"
WORLD = 2
#: where ./run-tests installs DeepSpeed (pip install --target), or deepspeed in this Python
TARGET = Path(os.environ.get("TRAINGUARD_DEEPSPEED_TARGET", REPO / ".deepspeed"))
FOUND = (TARGET / "deepspeed" / "__init__.py").is_file() or bool(
    importlib.util.find_spec("deepspeed")
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not FOUND,
        reason=f"deepspeed is not installed (./run-tests puts it in {TARGET}: "
        "DS_BUILD_OPS=0 pip install --target .deepspeed deepspeed==0.19.8)",
    ),
]


def env() -> dict[str, str]:
    extra = {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "GLOO_SOCKET_IFNAME": "lo"}
    out = child_env(extra)
    if TARGET.is_dir():
        out["PYTHONPATH"] = os.pathsep.join([out["PYTHONPATH"], str(TARGET)])
    return out


#: what a rank imports up to deepspeed.initialize (20 s of CPU a process on two busy cores;
#: initialize alone pulls in torch's compiler stack, sympy and setuptools): imported once, in
#: the fork server, each rank a fork of it
PRELOAD = [
    "torch",
    "deepspeed",
    "deepspeed.ops",
    "deepspeed.ops.op_builder.all_ops",
    "deepspeed.runtime.engine",
    "deepspeed.runtime.zero.stage_1_and_2",
    "deepspeed.runtime.zero.muon",
    "deepspeed.module_inject.auto_ep_layer",
    "torch._dynamo",
    "torch._inductor.compile_fx",
    "torch.utils.cpp_extension",
    "sympy",
    "setuptools",
    "trainguard.checkpoint",
]


@pytest.fixture(scope="module")
def ds_zygote() -> Iterator[Zygote]:
    """A fork server with DeepSpeed imported (PRELOAD)."""
    with Zygote(PRELOAD, env()) as z:
        yield z


def start(zygote: Zygote, loc: Path, stage: int, gate: Path) -> list[Forked]:
    port = free_port()
    return [
        zygote.spawn(
            [str(CHILD), str(loc), str(stage), str(rank), str(WORLD), str(port), str(gate)],
            env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for rank in range(WORLD)
    ]


@pytest.mark.parametrize("stage", [1, 2])
def test_deepspeed_killed_mid_save_never_leaves_a_complete_step_that_does_not_load(
    tmp_path: Path, ds_zygote: Zygote, stage: int
) -> None:
    rng = random.Random(f"deepspeed-{stage}")
    loc = tmp_path / "ckpt"
    left_unfinished = 0
    checks: list[str] = []
    lost_latest = 0
    named_not_whole = 0
    for kill in range(3):
        gate = tmp_path / f"gate-{kill}"
        os.mkfifo(gate)
        procs = start(ds_zygote, loc, stage, gate)
        gate_w = -1
        try:
            # opens once rank 0 opens its end: after its imports and deepspeed.initialize
            gate_w = wait_for(
                lambda g=gate: os.open(g, os.O_WRONLY | os.O_NONBLOCK), timeout=240, ignore=OSError
            )
            saves = rng.randint(1, 3)  # whole saves before the one the kill lands in
            if kill == 0:  # at a file write of the save: a step directory without `latest`
                order = f"killat {rng.randint(1, 2)}"
            else:  # at a random moment: mostly in the save, some just after it
                order = f"kill {rng.uniform(0.0, 1.2):.3f}"
            os.write(gate_w, ("go\n" * saves + order + "\n").encode())
            procs[0].wait(240)  # generous: 7 helpers share 2 cores
            assert procs[0].returncode == -signal.SIGKILL, procs[0].returncode
        finally:
            for p in procs:
                with contextlib.suppress(ProcessLookupError):  # rank 0 killed itself
                    os.killpg(p.pid, signal.SIGKILL)
            for p in procs:
                p.communicate()
            if gate_w >= 0:
                os.close(gate_w)
        tag = (loc / "latest").read_text().strip() if (loc / "latest").exists() else ""
        newest = int(tag.removeprefix("global_step")) if tag else -1
        complete = committed_steps(loc, PATTERN, "auto")
        steps = sorted(s for s, _ in complete)
        after = sorted(int(p.name[len("global_step") :]) for p in loc.glob("global_step*"))
        unfinished = [s for s in after if s > newest or not tag]
        left_unfinished += bool(unfinished)
        assert not set(steps) & set(unfinished), f"kill {kill}: steps after {tag!r} complete"
        if not tag:
            # killed between DeepSpeed's open(latest, "w") and its write: no step is named, so
            # none is complete (DeepSpeed's own load_checkpoint fails on it too); the next run
            # starts over and names its first save
            assert (loc / "latest").exists() and steps == [], steps
            lost_latest += 1
            print(f"kill {kill}: 'latest' empty, no step complete, unfinished {unfinished}")
            continue
        # DeepSpeed 0.19.8 has rank 0 write `latest` with no barrier after the other ranks'
        # saves: a kill then leaves `latest` naming a step whose other rank's optimizer file is
        # cut short; the file's own length (a torch zip's end record) keeps it from complete
        assert steps and set(steps) <= {s for s in after if s <= newest}, (steps, tag)
        named_not_whole += newest not in steps
        snap = tmp_path / f"after-kill-{kill}"  # loaded at the end, in one world
        shutil.copytree(loc, snap, symlinks=True, copy_function=os.link)  # never rewritten
        checks.append(f"{snap}:{','.join(str(s) for s in steps)}")
        found = latest(loc, pattern=PATTERN, grace=0)
        assert found is not None and found.step == steps[-1]
        sc = Scraper([CheckpointTarget(RUN, "primary", loc, PATTERN)], grace=0)
        try:
            s, errors = sc.scrape()
            assert errors == []
            assert ck(s, "last_step") == steps[-1]
        finally:
            sc.verifier.stop()
        print(f"kill {kill}: complete {steps}, latest {tag!r}, unfinished {unfinished}")
    port = free_port()
    procs = [
        ds_zygote.spawn(
            [str(CHILD), "check", str(stage), str(rank), str(WORLD), str(port), *checks],
            env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for rank in range(WORLD)
    ]
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out[-3000:]
    assert left_unfinished >= 1, "no kill left an unfinished step: the kills missed every save"
    assert lost_latest < 3, "every kill emptied 'latest': nothing was checked"
    print(f"'latest' emptied {lost_latest}, named a step not whole {named_not_whole} times")
