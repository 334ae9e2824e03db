"""How a sampled stack is described: user frames by base name and line, bounded and sanitised.

Real threads blocked in real functions; the description is read with the reporter's own
``Describer`` from ``sys._current_frames()``.
"""

from __future__ import annotations

import io
import queue
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from helpers.wait import wait_for
from trainguard.run.stack import MAX_WHERE, Describer


def waiting_frame(thread: threading.Thread) -> FrameType:
    """The thread's innermost frame, once it waits (in a lock's or condition's ``wait``)."""

    def waiting() -> FrameType | None:
        frame = sys._current_frames().get(thread.ident or 0)
        return frame if frame is not None and frame.f_code.co_name == "wait" else None

    return wait_for(waiting, 30, what="the thread to wait")


@contextmanager
def blocked(target: Callable[[threading.Event], object]) -> Iterator[FrameType]:
    """A thread running ``target(release)``; yields its innermost frame once it waits."""
    release = threading.Event()
    thread = threading.Thread(target=target, args=(release,), daemon=True)
    thread.start()
    try:
        yield waiting_frame(thread)
    finally:
        release.set()
        thread.join(30)


def load_batch(release: threading.Event) -> None:
    release.wait()  # LINE


def test_user_frames_by_base_name_and_line_after_the_library_call() -> None:
    line = next(
        i
        for i, text in enumerate(Path(__file__).read_text(encoding="utf-8").splitlines(), 1)
        if text.rstrip().endswith("# LINE")
    )
    with blocked(load_batch) as frame:
        where, collective = Describer().describe(frame)
    assert where.startswith(f"Event.wait <- test_stack_describe.py:{line} load_batch"), where
    assert "/" not in where and collective is None


def test_control_characters_replaced_and_length_capped() -> None:
    # a file name with an escape sequence, and a chain of user frames with very long names
    names = [f"f{i}_" + "x" * 60 for i in range(6)]
    source = "".join(
        f"def {name}(release):\n    return {names[i + 1] if i + 1 < len(names) else 'q.get'}"
        f"({'release' if i + 1 < len(names) else ''})\n"
        for i, name in enumerate(names)
    )
    scope: dict[str, object] = {"q": queue.Queue()}
    exec(compile(source, "/secret/dir/ev\x1b[2Jil.py", "exec"), scope)
    q = scope["q"]
    assert isinstance(q, queue.Queue)
    start = scope[names[0]]
    assert callable(start)
    thread = threading.Thread(target=start, args=(None,), daemon=True)
    thread.start()
    try:
        where, _ = Describer().describe(waiting_frame(thread))
    finally:
        q.put(None)
        thread.join(30)
    assert len(where) <= MAX_WHERE and where.endswith("..."), where
    assert "\x1b" not in where and "/secret" not in where, where
    assert where.startswith("Queue.get <- ev?[2Jil.py:"), where


class _SlowFile(io.BytesIO):
    """A file whose first write waits for ``release``: a save to a slow volume."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release

    def write(self, data: Any) -> int:
        self.release.wait()
        return super().write(data)


def test_a_thread_inside_torch_save_is_saving_one_in_a_data_function_is_not() -> None:
    torch = pytest.importorskip("torch")

    def save(release: threading.Event) -> None:
        torch.save({"w": torch.zeros(4)}, _SlowFile(release))

    with blocked(save) as frame:
        assert Describer().saving(frame)
    with blocked(load_batch) as frame:
        assert not Describer().saving(frame)
