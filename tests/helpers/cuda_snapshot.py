"""The CUDA memory-snapshot entry points of torch's C extension, for the CPU build of torch the
tests run on. A CUDA build's ``torch._C`` has ``_cuda_memorySnapshot`` and
``_cuda_record_memory_history``; a CPU build has neither, so ``torch.cuda.memory._snapshot()``
raises AttributeError (the real no-CUDA path, tested as it is). Providing the two functions at
that boundary lets torch's own Python layer (``torch.cuda.memory._snapshot``,
``_record_memory_history``) and all of trainguard's code run unchanged, and the files, names,
rotation, metadata and counters be checked. What it cannot show: that a real snapshot of a real
GPU pickles and loads in memory_viz (the GPU check of issue 18 does)."""

from __future__ import annotations

from typing import Any

#: what ``_cuda_memorySnapshot`` returns, shaped as torch documents a snapshot: one segment
#: with a live and a free block, and one trace event
SNAPSHOT: dict[str, Any] = {
    "segments": [
        {
            "device": 0,
            "address": 1 << 40,
            "total_size": 4 << 20,
            "stream": 0,
            "segment_type": "large",
            "segment_pool_id": (0, 0),
            "allocated_size": 2 << 20,
            "active_size": 2 << 20,
            "blocks": [
                {
                    "address": 1 << 40,
                    "size": 2 << 20,
                    "requested_size": 2 << 20,
                    "state": "active_allocated",
                    "frames": [{"filename": "train.py", "line": 42, "name": "forward"}],
                },
                {
                    "address": (1 << 40) + (2 << 20),
                    "size": 2 << 20,
                    "requested_size": 0,
                    "state": "inactive",
                    "frames": [],
                },
            ],
        }
    ],
    "device_traces": [
        [
            {
                "action": "alloc",
                "addr": 1 << 40,
                "size": 2 << 20,
                "stream": 0,
                "frames": [{"filename": "train.py", "line": 42, "name": "forward"}],
            }
        ]
    ],
}

#: Python source a child process runs to install them (``PAD`` bytes of padding make the
#: snapshot as large as a test needs: a real one is often hundreds of MB)
INSTALL = r"""
import copy, torch

def _install(pad=0):
    calls = []
    def snapshot(device=None):
        calls.append("snapshot")
        s = copy.deepcopy(SNAPSHOT)
        if pad:
            s["padding"] = bytes(pad)
        return s
    def record(*args):
        calls.append("record")
    torch._C._cuda_memorySnapshot = snapshot
    torch._C._cuda_record_memory_history = record
    torch.cuda.is_available = lambda: True
    return calls
"""


def child_source(pad: int = 0) -> str:
    """Source that installs the entry points in a child process (after ``import torch``)."""
    return f"SNAPSHOT = {SNAPSHOT!r}\n{INSTALL}\n_install({pad})\n"


def install(monkeypatch: Any, torch: Any) -> list[str]:
    """Install them in this process for one test (undone after it); returns the calls made.
    ``is_available`` says True too, as it does on a CUDA machine."""
    calls: list[str] = []

    def snapshot(device: object = None) -> dict[str, Any]:
        calls.append("snapshot")
        return SNAPSHOT

    def record(*args: object) -> None:
        calls.append("record")

    monkeypatch.setattr(torch._C, "_cuda_memorySnapshot", snapshot, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_record_memory_history", record, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    return calls
