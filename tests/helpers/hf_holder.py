"""A real ``trainguard.Run`` announcing Hugging Face ``checkpoint-N`` directories, as a child.

For ``trainguard status`` over framework checkpoints (tests/exporter/test_status_checkpoints.py,
bench/bench_status.py): "finished" writes the heartbeat and closes the run; "alive" prints
``ready`` and keeps the process (and its heartbeat) alive until it is killed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers.exporter_proc import child_env

_HOLD = """
import sys, time
from trainguard import Run
run = Run(sys.argv[5], checkpoint_dir=sys.argv[1], checkpoint_pattern="checkpoint-{step}",
          checkpoint_layout="huggingface", state_dir=sys.argv[2], interval=0.1)
run.step(int(sys.argv[3]))
if sys.argv[4] == "alive":
    print("ready", flush=True)
    time.sleep(3600)
run.close()
"""


def hold(out: Path, state: Path, step: int, mode: str, name: str) -> subprocess.Popen[str]:
    """Start the run ``name`` at ``step`` over ``out``'s directories; ``mode``: alive|finished."""
    return subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(out), str(state), str(step), mode, name],
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
