"""What the framework callbacks share.

The run's name, the scalars taken from a framework's logs, and the life of one
:class:`trainguard.Run` (start, steps, clean end, failure). The callbacks only translate a
framework's events into these calls; everything else (heartbeat, deaths across restarts, allocator
stats, OOM snapshots) is ``Run``'s.
"""

from __future__ import annotations

import atexit
import math
import numbers
import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from trainguard.run.reporter import Run
from trainguard.shared.statedir import RUN_ENV

#: a framework's log keys -> the scalar names trainguard publishes (``trainguard_run_scalar``)
_RENAMES = {
    "loss": "loss",
    "train/loss": "loss",
    "learning_rate": "lr",
    "lr": "lr",
    "grad_norm": "grad_norm",
    "epoch": "epoch",
}
#: suffixes of throughput keys (``train_samples_per_second``, ``train/samples_per_sec``...)
_RATES = {
    "samples_per_second": "samples_per_s",
    "samples_per_sec": "samples_per_s",
    "tokens_per_second": "tokens_per_s",
    "tokens_per_sec": "tokens_per_s",
    "steps_per_second": "steps_per_s",
}
TOKENS_SEEN = "num_input_tokens_seen"


def missing_framework(module: str, extra: str, exc: ImportError) -> ImportError:
    """The error a callback module raises when its framework cannot be imported."""
    return ImportError(
        f"trainguard.integrations.{extra} needs {module}, which cannot be imported ({exc}); "
        f"install it with: pip install 'trainguard[{extra}]'"
    )


def run_name(explicit: str | None, *fallbacks: str | os.PathLike[str] | None) -> str:
    """The run's name: ``explicit``, else ``$TRAINGUARD_RUN``, else the first fallback given.

    ``$TRAINGUARD_RUN`` is set by ``trainguard launch --name``; a fallback is taken as: a
    framework's run name as is, a directory by its last component (the name must stay the same
    across restarts, so that deaths are counted).
    """
    if explicit:
        return explicit
    env = os.environ.get(RUN_ENV, "").strip()
    if env:
        return env
    for fallback in fallbacks:
        if fallback is None:
            continue
        if isinstance(fallback, str) and os.sep not in fallback and fallback.strip():
            return fallback.strip()
        base = os.path.basename(os.path.normpath(os.path.abspath(os.fspath(fallback))))
        if base:
            return base
    return "train"


def scalars_from(logs: Mapping[str, Any]) -> dict[str, float]:
    """The numbers in a framework's logs that trainguard publishes, under its own names."""
    out: dict[str, float] = {}
    for key, value in logs.items():
        name = _RENAMES.get(key)
        if name is None:
            name = next((v for k, v in _RATES.items() if key.endswith(k)), None)
            if name is None:
                continue
        number = as_float(value)
        if number is not None:
            out[name] = number
    return out


def as_float(value: Any) -> float | None:
    """A Python number or a one-element tensor (``.item()``) as a float, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    item = getattr(value, "item", None)
    if item is not None and getattr(value, "numel", lambda: 0)() == 1:
        try:
            got = item()
        except Exception:
            return None
        return float(got) if isinstance(got, numbers.Real) and not isinstance(got, bool) else None
    return None


#: the life of each (run name, rank) that opened a Run in this process last: a second trainer of
#: the same run (a notebook cell that builds it again) must not write its heartbeat from a second
#: Run, each overwriting the other's
_OWNERS: dict[tuple[str, int], RunLife] = {}
_OWNERS_LOCK = threading.Lock()


class RunLife:
    """One ``Run`` driven by a framework's events.

    A process that ends after training began but before the framework said it ended (an exception
    caught by the script, an uncaught one) records a failure, with the exception's type when the
    interpreter saw one. Before training began (:meth:`prepare`), the end is the ``Run``'s.
    """

    def __init__(self, run_kwargs: Mapping[str, Any]) -> None:
        self._run_kwargs = dict(run_kwargs)
        self.run: Run | None = None
        self._scalars: dict[str, float] = {}
        self._tokens: tuple[float, float] | None = None  # (tokens seen, monotonic time)
        self._lock = threading.Lock()
        self._hooked = False
        self.ended = False  # the framework said training ended (cleanly or not)
        self.starting = False  # the open run has not begun training (prepare, then start)

    def prepare(
        self,
        name: str,
        rank: int,
        checkpoint_dir: str | os.PathLike[str] | None,
        checkpoint_pattern: str | None,
        checkpoint_layout: str | None = None,
        job: str | None = None,
    ) -> Run | None:
        """The open ``Run``, created in its starting phase when none is open.

        Called at the framework's set-up, before it loads a checkpoint: a relaunch that dies
        there is a process the exporter sees and counts (docs/heartbeat.md#starting). The
        interpreter's end, while still starting, is the ``Run``'s own: a clean exit finished
        (an evaluation-only script), an uncaught exception failed. None while another trainer of
        this process trains the same run and rank (it keeps the heartbeat).
        """
        if not self._claim((name, rank), starting=True):
            return None
        return self._open(
            name, rank, checkpoint_dir, checkpoint_pattern, checkpoint_layout, True, job
        )

    def _claim(self, key: tuple[str, int], *, starting: bool) -> bool:
        """Take ``key`` for this life: another life's starting run gives way (closed, finished).

        False (nothing taken) for a starting run while another life trains that run and rank.
        """
        with _OWNERS_LOCK:
            other = _OWNERS.get(key)
            gives_way = None
            if other is not None and other is not self and other.run is not None:
                with other._lock:
                    if not other.ended and not other.starting and starting:
                        return False
                    if not other.ended and other.starting:
                        gives_way, other.ended = other.run, True
            _OWNERS[key] = self
        if gives_way is not None:
            gives_way.close()  # never trained: a clean end, before this life's Run writes
        return True

    def start(
        self,
        name: str,
        rank: int,
        checkpoint_dir: str | os.PathLike[str] | None,
        checkpoint_pattern: str | None,
        checkpoint_layout: str | None = None,
        job: str | None = None,
    ) -> Run:
        """The open ``Run``, its training begun: created at the first start (or after an end).

        A starting ``Run`` (:meth:`prepare`) of this name and rank begins; one of another name
        (a hyperparameter search's trial renames the run) ends cleanly and a new one starts.
        After an end, a second ``train()`` is a new process life of the same run and rank.
        ``job``: the framework's own launcher's job identity, unless the user gave one.
        """
        with self._lock:
            run = self.run
            if run is not None and not self.ended and self.starting:
                if (run.name, run.rank) == (name, rank):
                    run.begin(checkpoint_dir, checkpoint_pattern, checkpoint_layout)
                    self.starting = False
                    return run
                self.ended = True
            else:
                run = None
        if run is not None:
            run.close()  # never trained under that name: nothing to fail
        self._claim((name, rank), starting=False)
        return self._open(
            name, rank, checkpoint_dir, checkpoint_pattern, checkpoint_layout, False, job
        )

    def _open(
        self,
        name: str,
        rank: int,
        checkpoint_dir: str | os.PathLike[str] | None,
        checkpoint_pattern: str | None,
        checkpoint_layout: str | None,
        starting: bool,
        job: str | None = None,
    ) -> Run:
        with self._lock:
            if self.run is not None and not self.ended:
                return self.run
            kwargs = {
                "checkpoint_dir": checkpoint_dir,
                "checkpoint_pattern": checkpoint_pattern if checkpoint_dir else None,
                "checkpoint_layout": checkpoint_layout if checkpoint_dir else None,
                "rank": rank,
                **self._run_kwargs,
            }
            if job is not None and kwargs.get("job") is None:
                kwargs["job"] = job
            self.run = Run(name, starting=starting, **kwargs)
            self.ended = False
            self.starting = starting
            if not self._hooked:
                # after Run's own atexit hook, so it runs before it (atexit is LIFO)
                atexit.register(self._at_exit)
                self._hooked = True
            return self.run

    def step(self, step: int, timing: tuple[float | None, float | None] = (None, None)) -> None:
        """Report ``step`` with the kept scalars and (data, compute) seconds measured for it.

        Not while starting: an evaluation's log before training is no step of training.
        """
        run = self.run
        if run is not None and not self.starting:
            run.step(step, data_seconds=timing[0], compute_seconds=timing[1], **self._scalars)

    def log(self, logs: Mapping[str, Any]) -> None:
        """Keep the scalars of a framework's log line for the following steps."""
        found = scalars_from(logs)
        tokens = as_float(logs.get(TOKENS_SEEN))
        if tokens is not None and math.isfinite(tokens):
            now = time.monotonic()
            if self._tokens is not None and now > self._tokens[1] and tokens > self._tokens[0]:
                found.setdefault(
                    "tokens_per_s", (tokens - self._tokens[0]) / (now - self._tokens[1])
                )
            self._tokens = (tokens, now)
        if found:
            self._scalars = {**self._scalars, **found}

    def finish(self) -> None:
        """Training ended by itself: a clean finish."""
        with self._lock:
            run, self.ended = self.run, True
        if run is not None:
            run.close()

    def fail(self, exc: BaseException | None) -> None:
        """Record the run failed: training raised ``exc`` (None: unknown).

        First an OOM snapshot if it is a CUDA OOM and ``oom_snapshots=True``.
        """
        with self._lock:
            run, ended, self.ended = self.run, self.ended, True
        if run is None or ended:
            return
        if exc is None:
            run.close(finished=False)
            return
        run.capture_oom().__exit__(type(exc), exc, exc.__traceback__)
        run.__exit__(type(exc), exc, exc.__traceback__)

    def _at_exit(self) -> None:
        # still starting: the Run's own exit hooks say finished, or failed by an exception
        if self.run is not None and not self.ended and not self.starting:
            self.fail(getattr(sys, "last_value", None))
