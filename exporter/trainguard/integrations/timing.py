"""The framework callbacks' stopwatch: one rank's time waiting for data and computing per step.

These are the two durations ``Run.step(data_seconds=, compute_seconds=)`` takes. With DDP
the gradient all-reduce makes every rank wait for the slowest, so wall time per step is the
same on every rank and says nothing; what a rank spends on its own before that collective
does: waiting for its next batch, and computing before the backward (the forward and the
loss). The callbacks mark those moments from the framework's hooks:

- ``step_ended`` when a step is done: the wait for the next batch starts;
- ``interrupted`` when something that is not waiting for data runs before the next batch (a
  checkpoint save, an evaluation, a logging step that reads the loss off the GPU): that
  step's data wait is not measured;
- ``compute_started`` when the batch is in hand (the data wait ends, computing starts);
- ``compute_ended`` just before the backward (Lightning's ``on_before_backward``) or at the
  end of a forward (the Hugging Face Trainer, through a forward hook on the model).

The data wait is the training thread's wall time. On a GPU, compute is timed by CUDA events
recorded on the current stream and read once the GPU has passed them (``Event.query()``,
never a synchronisation): the CPU only queues the kernels, its wall time would measure the
launches. Durations the GPU has not reached yet are added at a later step.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

#: CUDA event pairs waiting for the GPU; beyond this many the oldest are dropped (a GPU this
#: far behind is reported by its next pairs)
MAX_PENDING = 64


class StepClock:
    """Data wait and compute of one rank's steps, summed until the next ``take``."""

    def __init__(self) -> None:
        self._data_from: float | None = None
        self._compute_from: float | None = None
        self._cuda_start: Any = None
        self._pending: deque[tuple[Any, Any]] = deque()
        self._data: float | None = None
        self._compute: float | None = None

    def step_ended(self) -> None:
        """A step is done: from now on the rank waits for its next batch."""
        self._data_from = time.perf_counter()
        self._compute_from = self._cuda_start = None

    def interrupted(self) -> None:
        """Something other than the data loader runs before the next batch: skip this wait."""
        self._data_from = None

    def compute_started(self, cuda: bool = False) -> None:
        """The batch is in hand: the data wait ends and computing starts.

        ``cuda``: the step computes on a CUDA device, timed by events on its current stream.
        """
        now = time.perf_counter()
        if self._data_from is not None:
            self._data = (self._data or 0.0) + (now - self._data_from)
            self._data_from = None
        if cuda:
            self._cuda_start = _cuda_event()
            self._compute_from = None
        else:
            self._compute_from, self._cuda_start = now, None

    def compute_ended(self) -> None:
        """Computing before the backward's all-reduce ends (or a forward ends)."""
        if self._compute_from is not None:
            self._compute = (self._compute or 0.0) + (time.perf_counter() - self._compute_from)
        elif self._cuda_start is not None:
            if len(self._pending) >= MAX_PENDING:
                self._pending.popleft()
            self._pending.append((self._cuda_start, _cuda_event()))
        self._compute_from = self._cuda_start = None

    def take(self) -> tuple[float | None, float | None]:
        """(data seconds, compute seconds) measured since the last take; None: not measured."""
        while self._pending and self._pending[0][1].query():
            start, end = self._pending.popleft()
            self._compute = (self._compute or 0.0) + start.elapsed_time(end) / 1000.0
        out = (self._data, self._compute)
        self._data = self._compute = None
        return out


def _cuda_event() -> Any:
    """A timing CUDA event recorded now on the current stream (torch is imported by then)."""
    import torch

    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event
