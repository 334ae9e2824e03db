"""The state directory, where the reporter and the exporter meet.

Both sides resolve it the same way, so that on one workstation they agree without any
configuration.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

STATE_DIR_ENV = "TRAINGUARD_STATE_DIR"
#: the run's name, as ``trainguard launch --name`` passes it to the training command
RUN_ENV = "TRAINGUARD_RUN"


def default_state_dir() -> Path:
    r"""The state directory: ``$TRAINGUARD_STATE_DIR``, else a per-user state directory.

    The per-user one is ``$XDG_STATE_HOME/trainguard``, ``~/.local/state/trainguard``, or
    ``%LOCALAPPDATA%\trainguard`` on Windows.
    """
    env = os.environ.get(STATE_DIR_ENV)
    if env:
        return Path(env).expanduser()
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA")
        if base:
            return Path(base) / "trainguard"
    xdg = os.environ.get("XDG_STATE_HOME")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "trainguard"
    return Path.home() / ".local" / "state" / "trainguard"
