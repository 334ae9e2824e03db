"""The state directory, where the reporter and the exporter meet.

Both sides resolve it the same way, so that on one workstation they agree without any
configuration.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path

STATE_DIR_ENV = "TRAINGUARD_STATE_DIR"
#: the run's name, as ``trainguard launch --name`` passes it to the training command
RUN_ENV = "TRAINGUARD_RUN"
#: what a state file's readable hint keeps of a name; the rest becomes "_"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


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


def state_file_stem(hint: str, key: str, *, fallback: str, digits: int = 8) -> str:
    """``<hint>-<hex>``: the name of a state file that belongs to ``key``, before its suffix.

    The readable part is only a hint (run names and paths may hold '/', '..' or anything else):
    sanitised to ``[A-Za-z0-9_-]``, at most 48 characters, ``fallback`` when nothing is left.
    The first ``digits`` hex digits of the SHA-256 of the real key keep apart what sanitises
    alike. Every state file named after a run or a directory (heartbeats, save status, restore
    results) is named this way, so that the name of one never depends on who wrote it.
    """
    safe = _UNSAFE.sub("_", hint)[:48].strip("_") or fallback
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:digits]
    return f"{safe}-{digest}"
