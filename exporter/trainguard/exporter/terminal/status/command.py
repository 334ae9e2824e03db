"""``trainguard status``: the runs this host knows, as a table, plain text or JSON.

Read with the exporter's run table, checkpoint verdict and GPU collector: no judgement of its own.

Stalled: alive, no new step for longer than ``--stall`` (10m, the least stall TrainingStalled
pages on). The alert adapts (``stall_factor`` x the run's longest recent gap between steps, from
Prometheus' history); with no history this uses the fixed threshold: a run stepping slower than
``--stall`` shows as stalled here first. Starting: alive, not training yet (loading a
checkpoint, evaluating), never stalled. Stopping, stopped: ``trainguard stop`` asked the
process to end, before and after it did (an end on purpose, which pages nothing). Steps per
second: from two reads of the heartbeats ``--sample`` seconds apart (or two ``--watch``
refreshes), the steps between them over the time between their ``step_time``s; empty when the
run reported no new step in between.

Longer than 400 lines because it is one view: the snapshot of the runs, its rows' cells and
the lines under the table (stuck ranks, GPUs) are drawn from one model, in three formats.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from trainguard.exporter.collectors.gpu.collector import GpuCollector
from trainguard.exporter.config.model import Config
from trainguard.exporter.runs.rows import exit_of, last_death, starting, stuck_at
from trainguard.exporter.runs.table import RunRow, RunTable
from trainguard.exporter.runs.targets import CheckpointTarget
from trainguard.exporter.scrape.context import Scrape
from trainguard.exporter.terminal.status.checkpoints import Found, judge_all

#: (run, rank) -> gpu index -> driver-view bytes
RunMem = dict[tuple[str, str], dict[str, int | None]]


@dataclass
class Location:
    location: str
    path: str
    step: int | None  # newest complete checkpoint worth resuming from, as latest() finds it
    #: (never one saved with a NaN loss)
    at_risk: int | None  # run step - newest complete step
    error: str | None = None


@dataclass
class RunStatus:
    run: str
    rank: str
    state: str  # alive, nan-loss, starting, stalled, stopping, finished, stopped, dead, unknown
    pid: int | None
    step: int | None
    steps_per_second: float | None
    step_age_seconds: float | None
    deaths: int
    last_death_cause: str | None
    checkpoints: list[Location] = field(default_factory=list)
    gpu_driver_bytes: dict[str, int | None] = field(default_factory=dict)  # gpu index -> bytes
    allocator_reserved_bytes: dict[str, int] = field(default_factory=dict)  # device -> bytes
    stuck: str | None = None  # where its main thread is while its step is overdue
    loss: float | None = None  # the last loss it reported (NaN as null in JSON)
    #: observed steps, up to the latest, whose loss was not finite (None: no such record)
    loss_nonfinite_streak: int | None = None
    #: the streak's first observed step: the loss turned non-finite after
    #: loss_last_finite_step and at or before this one
    loss_nonfinite_first_step: int | None = None
    loss_last_finite_step: int | None = None
    #: how its process ended, when it ended unfinished: the exporter's exit cause
    #: (on_purpose, signal, time_limit, exception, unknown)
    exit_cause: str | None = None
    #: when ``trainguard stop`` asked its current process to stop (None: nobody did)
    stop_requested: float | None = None


@dataclass
class GpuStatus:
    gpu: str
    uuid: str
    used_bytes: int
    total_bytes: int
    unattributed_bytes: int | None  # ghost: used that no live process accounts for

    @property
    def ghost_share(self) -> float | None:
        if self.unattributed_bytes is None or not self.used_bytes:
            return None
        return self.unattributed_bytes / self.used_bytes


@dataclass
class Snapshot:
    state_dir: str
    taken: float
    runs: list[RunStatus]
    nvml: bool
    gpus: list[GpuStatus]
    errors: list[str]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for g, d in zip(self.gpus, out["gpus"], strict=True):
            d["ghost_share"] = g.ghost_share
        for r in out["runs"]:  # JSON has no NaN: the streak says the loss is not finite
            if r["loss"] is not None and not math.isfinite(r["loss"]):
                r["loss"] = None
        return out


class StateDirError(Exception):
    """The state directory exists but cannot be read."""


class Status:
    """Reads snapshots; keeps the previous one's steps for the rate."""

    def __init__(self, config: Config, state_dir: Path, stall_seconds: float) -> None:
        self.state_dir = state_dir
        self.table = RunTable(config, state_dir)
        self.gpu = GpuCollector(pid_runs=self.table.pid_runs)
        self.stall = stall_seconds
        self._prev: dict[tuple[str, str], tuple[int, float]] = {}
        self._rates: dict[tuple[str, str], float] = {}
        self.targets: list[CheckpointTarget] = []  # the last read's checkpoint locations

    def close(self) -> None:
        self.gpu.close()

    def read(self, checkpoints: bool = True) -> Snapshot:
        """The runs now; ``checkpoints=False`` leaves their checkpoints to :meth:`attach`."""
        scrape = Scrape()
        view = self.table.view(scrape)
        for err in view.errors:
            if err.startswith(f"state dir {self.state_dir}: cannot list"):
                raise StateDirError(err)
        now = time.time()
        gpus, run_mem, nvml, gpu_errors = self._gpus(scrape)
        self.targets = self.table.checkpoint_targets(scrape)
        runs = [self._row(row, now, run_mem) for row in view.rows]
        bad = [why for _name, why in view.bad_files]
        errors = [*view.errors, *bad, *gpu_errors]
        snap = Snapshot(str(self.state_dir), now, runs, nvml, gpus, errors)
        if checkpoints:
            self.attach(snap, {})
        return snap

    def attach(self, snap: Snapshot, found: dict[tuple[str, str], Found]) -> None:
        """Give ``snap``'s runs their checkpoints: judged in ``found``, else judged now."""
        todo = [t for t in self.targets if (t.run, t.location) not in found]
        found = {**found, **judge_all(todo)}
        first: dict[str, RunStatus] = {}
        for r in snap.runs:  # checkpoints are the run's, shown once on its lowest rank
            if r.run not in first or int(r.rank) < int(first[r.run].rank):
                first[r.run] = r
        for r in first.values():
            mine = [t for t in self.targets if t.run == r.run]
            r.checkpoints = [_location(t, r.step, found[(t.run, t.location)]) for t in mine]

    def _gpus(self, scrape: Scrape) -> tuple[list[GpuStatus], RunMem, bool, list[str]]:
        """The GPU collector's own reading of NVML, taken apart."""
        own = scrape.for_collector()
        fams = {f.name: f for f in self.gpu.gather(own)}
        nvml = any(s.value == 1 for s in fams["trainguard_gpu_nvml_available"].samples)

        def by_gpu(name: str) -> dict[str, tuple[str, float]]:
            fam = fams.get(name)
            out: dict[str, tuple[str, float]] = {}
            for s in fam.samples if fam else ():
                out[s.labels["gpu"]] = (s.labels.get("uuid", ""), s.value)
            return out

        used = by_gpu("trainguard_gpu_memory_used_bytes")
        total = by_gpu("trainguard_gpu_memory_total_bytes")
        ghost = by_gpu("trainguard_gpu_memory_unattributed_bytes")
        gpus = [
            GpuStatus(
                gpu,
                uuid,
                int(value),
                int(total.get(gpu, ("", 0))[1]),
                int(ghost[gpu][1]) if gpu in ghost else None,
            )
            for gpu, (uuid, value) in sorted(used.items(), key=lambda kv: int(kv[0]))
        ]
        run_mem: RunMem = {}
        fam = fams.get("trainguard_run_gpu_memory_used_bytes")
        for s in fam.samples if fam else ():
            key = (s.labels["run"], s.labels["rank"])
            run_mem.setdefault(key, {})[s.labels["gpu"]] = int(s.value)
        return gpus, run_mem, nvml, own.errors

    def _row(self, row: RunRow, now: float, run_mem: RunMem) -> RunStatus:
        hb = row.heartbeat
        step = hb.step if hb else None
        step_time = (hb.step_time if hb else None) or (hb.started if hb else None)
        step_age = max(0.0, now - step_time) if step_time else None
        key = (row.run, row.rank)
        nonfinite = hb.nonfinite if hb else None
        if hb is not None and hb.step is not None and hb.step_time is not None:
            prev = self._prev.get(key)
            if prev is not None and hb.step_time > prev[1] and hb.step >= prev[0]:
                self._rates[key] = (hb.step - prev[0]) / (hb.step_time - prev[1])
            elif prev is not None and hb.step_time != prev[1]:
                self._rates.pop(key, None)
            self._prev[key] = (hb.step, hb.step_time)
        if row.finished:
            state = "finished"
        elif starting(row):
            state = "starting"
        elif row.up is True and row.stop is not None:
            state = "stopping"  # trainguard stop asked it to end: not judged on its steps
        elif row.up is True:
            stalled = step_age is not None and step_age > self.stall
            state = "stalled" if stalled else "alive"
            if not stalled and nonfinite is not None and nonfinite.loss_streak:
                state = "nan-loss"  # stepping, every step since likely wasted
        elif row.up is False:
            state = "stopped" if row.stop is not None else "dead"
        else:
            state = "unknown"
        death = last_death(list(hb.death_history)) if hb else None
        return RunStatus(
            run=row.run,
            rank=row.rank,
            state=state,
            pid=row.pid,
            step=step,
            steps_per_second=self._rates.get(key)
            if state in ("alive", "nan-loss", "stalled")
            else None,
            step_age_seconds=step_age,
            deaths=hb.deaths if hb else 0,
            last_death_cause=death.cause if death else None,
            gpu_driver_bytes=run_mem.get(key, {}),
            stuck=stuck_text(row),
            allocator_reserved_bytes={str(a.device): a.reserved_bytes for a in hb.allocator}
            if hb
            else {},
            loss=hb.scalars.get("loss") if hb else None,
            loss_nonfinite_streak=nonfinite.loss_streak if nonfinite else None,
            loss_nonfinite_first_step=nonfinite.loss_first_step if nonfinite else None,
            loss_last_finite_step=nonfinite.loss_last_finite_step if nonfinite else None,
            exit_cause=ended[0] if (ended := exit_of(row)) else None,
            stop_requested=row.stop.requested if row.stop else None,
        )


def _location(t: CheckpointTarget, step: int | None, found: Found) -> Location:
    newest, error = found  # the heartbeat lags the step: a checkpoint may already be newer
    risk = max(0, step - newest) if step is not None and newest is not None else None
    return Location(t.location, str(t.path), newest, risk, error)


#: the states that need nobody: ``trainguard status`` exits 0 when every run is in one
FINE = ("alive", "starting", "stopping", "finished", "stopped")


def exit_status(snap: Snapshot) -> int:
    """0 when every run is alive, starting or finished and nothing could not be read, else 1.

    Stopping and stopped are ``trainguard stop``'s, on purpose. For scripts: ``trainguard
    status >/dev/null || notify`` (a dead, stalled, unknown run or
    one stepping on a NaN loss, or an unreadable heartbeat). 2, bad input, is the caller's.
    """
    return 0 if all(r.state in FINE for r in snap.runs) and not snap.errors else 1


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 120:
        return f"{seconds:.0f}s"
    if s < 7200:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 172800:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def size(n: int | None) -> str:
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


COLOURS = {
    "alive": "green",
    "nan-loss": "bold red",
    "starting": "cyan",
    "stalled": "yellow",
    "finished": "blue",
    "stopping": "cyan",
    "stopped": "blue",
    "dead": "bold red",
    "unknown": "magenta",
}

#: a word up to this long is never folded in the middle on a narrow terminal
MAX_WORD = 12

COLUMNS = (
    "run",
    "rank",
    "state",
    "step",
    "steps/s",
    "last step",
    "checkpoints (at risk)",
    "deaths",
    "GPU driver / allocator",
)


def cells(r: RunStatus) -> list[str]:
    ckpts = []
    for loc in r.checkpoints:
        if loc.error:
            ckpts.append(f"{loc.location}: error ({loc.error})")
        elif loc.step is None:
            ckpts.append(f"{loc.location}: none complete")
        else:
            risk = "" if loc.at_risk is None else f" ({loc.at_risk})"
            ckpts.append(f"{loc.location}: {loc.step}{risk}")
    mem = []
    gpus = set(r.gpu_driver_bytes) | set(r.allocator_reserved_bytes)
    for g in sorted(gpus, key=int):
        drv = r.gpu_driver_bytes.get(g)
        alloc = r.allocator_reserved_bytes.get(g)
        mem.append(
            f"gpu{g}: {size(drv) if g in r.gpu_driver_bytes else '-'} / "
            f"{size(alloc) if alloc is not None else '-'}"
        )
    deaths = str(r.deaths) + (f" ({r.last_death_cause})" if r.last_death_cause else "")
    return [
        r.run,
        r.rank,
        r.state,
        "-" if r.step is None else str(r.step),
        "-" if r.steps_per_second is None else f"{r.steps_per_second:.2f}",
        duration(r.step_age_seconds) + " ago" if r.step_age_seconds is not None else "-",
        ", ".join(ckpts) or "-",
        deaths,
        ", ".join(mem) or "-",
    ]


def gpu_lines(snap: Snapshot) -> list[str]:
    if not snap.nvml:
        return ["GPUs: no NVML (no NVIDIA driver on this host): no driver-side memory"]
    out = []
    for g in snap.gpus:
        share = g.ghost_share
        ghost = (
            "unknown (a process's memory not reported)"
            if g.unattributed_bytes is None
            else (f"{size(g.unattributed_bytes)} ({share or 0:.0%} of used)")
        )
        out.append(
            f"GPU {g.gpu} {g.uuid}: used {size(g.used_bytes)} of {size(g.total_bytes)}, "
            f"ghost {ghost}"
        )
    return out or ["GPUs: none"]


def stuck_text(row: RunRow) -> str | None:
    """``in all_reduce: all_reduce <- train.py:40 step`` for a stuck rank, else None."""
    stuck = stuck_at(row)
    if stuck is None:
        return None
    where = stuck.where or "?"
    return f"in {stuck.collective}: {where}" if stuck.collective else f"at {where}"


def loss_lines(runs: list[RunStatus]) -> list[str]:
    """``loss: run llama rank 0 not finite since step 100 (last finite seen: step 99)``."""
    out = []
    for r in runs:
        if not r.loss_nonfinite_streak or r.state in ("finished", "dead"):
            continue
        first = "?" if r.loss_nonfinite_first_step is None else r.loss_nonfinite_first_step
        last = "none" if r.loss_last_finite_step is None else f"step {r.loss_last_finite_step}"
        out.append(
            f"loss: run {r.run} rank {r.rank} not finite since step {first} at the latest "
            f"(last finite seen: {last}); its checkpoints column names the newest saved with a "
            "finite loss"
        )
    return out


def stuck_lines(runs: list[RunStatus]) -> list[str]:
    """``stuck: run llama rank 3 at train.py:88 load_batch <- ...``, one per stuck rank."""
    return [f"stuck: run {r.run} rank {r.rank} {r.stuck}" for r in runs if r.stuck]


def plain(snap: Snapshot) -> str:
    """Plain text for a pipe or a file: aligned columns, no escape codes."""
    rows = [list(COLUMNS), *(cells(r) for r in snap.runs)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [f"trainguard status: {len(snap.runs)} run(s) in {snap.state_dir}"]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    if not snap.runs:
        lines.append("(no runs)")
    lines += [*loss_lines(snap.runs), *stuck_lines(snap.runs), *gpu_lines(snap)]
    lines += [f"error: {e}" for e in snap.errors]
    return "\n".join(lines) + "\n"


def rich_view(snap: Snapshot) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(
        title=f"trainguard status: {len(snap.runs)} run(s) in {snap.state_dir}",
        title_justify="left",
        box=None,
        header_style="bold",
        pad_edge=False,
        collapse_padding=True,  # one space between columns: nine fit in 80 columns
    )
    rows = [cells(r) for r in snap.runs]
    for i, col in enumerate(COLUMNS):
        # wide enough for its longest word: a narrow terminal wraps between words, and folds
        # only a word longer than MAX_WORD (a long run name)
        words = [w for text in [col, *(row[i] for row in rows)] for w in text.split()]
        width = min(max((len(w) for w in words), default=1), MAX_WORD)
        table.add_column(col, overflow="fold", min_width=width)
    for r, row in zip(snap.runs, rows, strict=True):
        row[2] = f"[{COLOURS.get(r.state, '')}]{r.state}[/]"
        table.add_row(*row)
    extra = [Text(line, style="bold red") for line in loss_lines(snap.runs)]
    extra += [Text(line, style="dim") for line in [*stuck_lines(snap.runs), *gpu_lines(snap)]]
    extra += [Text(f"error: {e}", style="red") for e in snap.errors]
    return Group(table, *extra)


def watch(status: Status, every: float, render: Callable[[Snapshot], Any]) -> None:
    """On a terminal: one table, redrawn in place."""
    from rich.live import Live

    with Live(render(status.read()), refresh_per_second=4, screen=False) as live:
        while True:
            time.sleep(every)
            live.update(render(status.read()))


def watch_plain(status: Status, every: float, out: TextIO) -> None:
    """Watch into a pipe or a file: every refresh appended, a blank line apart.

    As ``kubectl get -w`` does, so that ``--watch | tee status.log`` keeps the history (a pipe
    has no place to redraw in).
    """
    print(plain(status.read()), end="", file=out, flush=True)
    while True:
        time.sleep(every)
        print("\n" + plain(status.read()), end="", file=out, flush=True)


def watch_json(status: Status, every: float, out: TextIO) -> None:
    """``--watch --json``: one snapshot per line (JSON Lines), for a script to follow."""
    while True:
        print(json.dumps(status.read().to_json()), file=out, flush=True)
        time.sleep(every)


def state_dir_problem(path: Path, explicit: bool) -> str | None:
    """Why ``path`` cannot be read as a state dir.

    None if it can, or if it does not exist and was not named: no run has started yet.
    """
    if not path.exists():
        return f"state dir {path}: does not exist" if explicit else None
    if not path.is_dir():
        return f"state dir {path}: not a directory"
    if not os.access(path, os.R_OK | os.X_OK):
        return f"state dir {path}: cannot be read (permission denied)"
    return None
