"""``trainguard verify --restore PATH``: load the checkpoint a resume would load, as training would.

``verify`` says a checkpoint is whole (every file of its recorded or its format's length); only
loading it says a resume would work: a pickle ``weights_only=True`` refuses, a DCP shard that
``.metadata`` names and nobody wrote, a header that lies. The drill picks the checkpoint
``verify`` would resume from (the newest complete one; PATH may also name one checkpoint), loads
it in a child process (:mod:`trainguard.exporter.terminal.restore.load`) under an address-space
cap and a time limit, prints one line and leaves a result in the state directory that the
exporter exports (:mod:`trainguard.exporter.collectors.restore.result`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import trainguard.exporter.terminal.verify as vf
from trainguard.exporter.collectors.restore.result import (
    LOCATION_RE,
    Result,
    ResultError,
    read_result,
    result_filename,
    results_dir,
    write_result,
)
from trainguard.shared.heartbeat.record import check_run_name
from trainguard.shared.pattern import CheckpointPattern
from trainguard.shared.statedir import default_state_dir
from trainguard.shared.units import format_duration, parse_size

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_UNCHECKED = 0, 1, 2, 3
#: the default address-space cap: this much for the interpreter and torch (a CUDA build maps
#: gigabytes of libraries), plus twice the checkpoint's size
MEMORY_BASE = 8 * 2**30
MEMORY_FACTOR = 2
DEFAULT_TIMEOUT = 3600.0

EPILOG = (
    "With --restore: load the checkpoint a resume would load (the newest complete one under "
    "PATH, as above, or the one PATH names) in a child process, as training would: torch.load "
    "with weights_only=True, safetensors (every tensor), a DCP directory (its .metadata, every "
    "storage file it names, every item), a Hugging Face checkpoint (trainer_state.json, the "
    "weights and every shard their index names, the other files). The child runs under "
    "--memory-limit (address space, RLIMIT_AS) and --timeout, without GPUs. Exit status: 0 it "
    "loads (one line says what), 1 it does not (the file and what failed) or there is no "
    "complete checkpoint, 2 bad input, 3 not checked (a file needs torch, not installed here: "
    "pip install 'trainguard[torch]'). A result is written to the state directory for the "
    "exporter (docs/checkpoints.md#restore-drill), unless --no-result."
)


def add_arguments(v: argparse.ArgumentParser, duration: object) -> None:
    """The drill's options, on the ``verify`` subcommand."""
    g = v.add_argument_group("restore drill (--restore)")
    g.add_argument(
        "--restore",
        action="store_true",
        help="load the checkpoint a resume would load, in a child process; see below",
    )
    g.add_argument(
        "--memory-limit",
        default="auto",
        metavar="SIZE",
        help="the loader's address-space cap: a size (64GiB), 'none', or 'auto': 8GiB plus "
        "twice the checkpoint's size (default: auto)",
    )
    g.add_argument(
        "--timeout",
        type=duration,  # type: ignore[arg-type]
        default=DEFAULT_TIMEOUT,
        metavar="DURATION",
        help="the load is killed after this long and fails (default: 1h)",
    )
    g.add_argument("--run", metavar="NAME", help="the run the result is exported for")
    g.add_argument(
        "--location",
        metavar="NAME",
        help="the location's name in the exporter: primary or a mirror's (default: the "
        "exporter matches PATH against the locations it watches, else primary)",
    )
    g.add_argument("--state.dir", dest="state_dir", metavar="DIR", help="where to write the result")
    g.add_argument("--no-result", action="store_true", help="write no result file")


@dataclass
class Loaded:
    """What the child said (or what became of it)."""

    status: str  # ok, failed, unchecked
    reason: str
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    peak_rss: int = 0


def memory_limit(value: str, size: int) -> int:
    """The cap in bytes (0: none) for a checkpoint of ``size`` bytes; ValueError on bad input."""
    if value == "auto":
        return MEMORY_BASE + MEMORY_FACTOR * size
    if value in ("none", "0"):
        return 0
    limit = parse_size(value)
    if limit < 64 * 2**20:
        raise ValueError(f"expected 'auto', 'none' or at least 64MiB, got {value!r}")
    return limit


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    # the drill never touches a GPU (it must not take memory from training), and one thread
    # and few malloc arenas keep the address space what the data needs
    env.update(
        CUDA_VISIBLE_DEVICES="",
        OMP_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        MALLOC_ARENA_MAX="2",
    )
    return env


def run_loader(path: Path, limit: int, timeout: float) -> Loaded:
    """Load ``path`` in a child under ``limit`` bytes of address space and ``timeout``."""
    with tempfile.TemporaryDirectory(prefix="trainguard-restore-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "trainguard.exporter.terminal.restore.load"]
        cmd += ["--out", str(out), "--memory-limit", str(limit), str(path)]
        start = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            env=_child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            _, err = proc.communicate(timeout=timeout)
        except BaseException as exc:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            if isinstance(exc, subprocess.TimeoutExpired):
                return Loaded(
                    "failed",
                    f"{path.name}: did not load within --timeout {format_duration(timeout)}; "
                    "killed",
                    seconds=time.monotonic() - start,
                )
            raise
        seconds = time.monotonic() - start
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        try:
            doc = json.loads(out.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            doc = None
    if isinstance(doc, dict) and doc.get("status") in ("ok", "failed", "unchecked"):
        return Loaded(doc["status"], str(doc["reason"]), doc["files"], doc["bytes"], seconds, peak)
    return Loaded("failed", _death(path, proc.returncode, err, limit), seconds=seconds)


def _death(path: Path, code: int, err: bytes, limit: int) -> str:
    """Why the loader left no answer: killed by a signal, or crashed (its last stderr line).

    Under an address-space cap, an allocation that fails where nothing can catch it (a C
    library, a thread) ends the process this way too: the reason says so.
    """
    tail = (err.decode("utf-8", "replace").strip().splitlines()[-1:] or [""])[0][:300]
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        why = f"the loader was killed by {name} while loading {path.name}"
    else:
        why = f"the loader exited with status {code} while loading {path.name}: {tail}"
    if limit:
        why += (
            f" (address-space limit {limit / 2**30:.1f} GiB: out of memory? raise --memory-limit "
            "if the host has the memory)"
        )
    return why


def _pick(args: argparse.Namespace) -> tuple[vf.Report, vf.Item | None, str]:
    """The checkpoint to load: PATH itself when it names one, else what a resume would load.

    With the item, a note about newer checkpoints skipped; without, why there is none.
    """
    report = vf.verify(
        args.path, primary=args.primary, pattern=_pattern(args), grace=args.grace, check_hash=False
    )
    single = Path(report.directory).resolve() != args.path.resolve()
    if single and report.items:
        item = report.items[0]
        note = "" if item.verdict == "complete" else f" (verify: {item.verdict}, {item.detail})"
        return report, item, note
    if report.resume_from is None:
        newest = next((i for i in report.items if i.name == report.newest), None)
        why = f"no complete checkpoint under {report.directory}"
        if newest is not None:
            why += f" (newest: {newest.name}, {newest.verdict}: {newest.detail})"
        elif report.hint:
            why += f" ({report.hint})"
        return report, None, why
    item = next(i for i in report.items if i.name.rstrip("/") == report.resume_from)
    note = ""
    if report.newest and report.newest != item.name:
        newer = next(i for i in report.items if i.name == report.newest)
        note = f" (newer {newer.name} is {newer.verdict}: a resume would not load it)"
    return report, item, note


def _pattern(args: argparse.Namespace) -> str:
    """``--pattern``, or the framework's pattern that names PATH when PATH is one step directory.

    So ``verify --restore run/checkpoint-500`` works without ``--pattern 'checkpoint-{step}'``.
    """
    path: Path = args.path
    if not path.is_dir() or CheckpointPattern(args.pattern).dir_step(path.name) is not None:
        return str(args.pattern)
    for candidate, _ in vf.FRAMEWORK_PATTERNS:
        if CheckpointPattern(candidate).dir_step(path.name) is not None:
            return candidate
    return str(args.pattern)


def main_restore(args: argparse.Namespace) -> int:
    """Run the drill for the parsed ``verify --restore`` arguments; the exit status."""
    if args.run is not None and (problem := check_run_name(args.run)):
        return _bad(f"--run: {problem}")
    if args.location is not None and not LOCATION_RE.match(args.location):
        return _bad("--location: expected 1-128 of A-Z a-z 0-9 _ . : -")
    if not 0 < args.timeout <= 7 * 86400:
        return _bad("--timeout: expected a duration above 0 and at most 7d")
    try:
        memory_limit(args.memory_limit, 0)
        report, item, note = _pick(args)
    except ValueError as exc:
        return _bad(str(exc))
    except OSError as exc:
        return _bad(f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc))
    directory = os.path.abspath(report.directory)
    if item is None:
        loaded = Loaded("failed", note)
    else:
        target = Path(directory) / item.name.rstrip("/")
        limit = memory_limit(args.memory_limit, item.size)
        loaded = run_loader(target, limit, args.timeout)
    now = time.time()
    ok = loaded.status == "ok"
    what = f"step {item.step} ({item.name})" if item is not None else None
    if ok and item is not None:
        line = (
            f"restore OK: {what} loads: {loaded.files} files, {_gib(loaded.bytes)} in "
            f"{loaded.seconds:.1f}s, peak memory {_gib(loaded.peak_rss)}{note}"
        )
    elif loaded.status == "unchecked":
        line = f"restore NOT CHECKED: {what}: {loaded.reason}"
    else:
        line = f"restore FAILED: {what + ': ' if what else ''}{loaded.reason}"
        if item is not None and note:
            line += note
    result = _result(args, directory, item, ok, line, now)
    written = None
    if not args.no_result:
        state_dir = Path(args.state_dir).expanduser() if args.state_dir else default_state_dir()
        try:
            written = write_result(state_dir, result)
        except OSError as exc:
            print(
                f"trainguard verify: cannot write the result in {state_dir}: {exc}", file=sys.stderr
            )
    if args.json:
        doc = {**result.to_json(), "status": loaded.status, "result_file": str(written or "")}
        print(json.dumps(doc, indent=2))
    else:
        print(line)
    if ok:
        return EXIT_OK
    return EXIT_UNCHECKED if loaded.status == "unchecked" else EXIT_FAILED


def _result(
    args: argparse.Namespace,
    directory: str,
    item: vf.Item | None,
    ok: bool,
    line: str,
    now: float,
) -> Result:
    """This check's result, with the last success carried over from the previous result."""
    verified: tuple[int | None, float | None, str | None] = (None, None, None)
    if ok and item is not None:
        verified = (item.step, now, item.name)
    elif not args.no_result:
        state_dir = Path(args.state_dir).expanduser() if args.state_dir else default_state_dir()
        with contextlib.suppress(OSError, ResultError):
            before = read_result(
                results_dir(state_dir) / result_filename(directory, args.run, args.location)
            )
            verified = (before.verified_step, before.verified_time, before.verified_checkpoint)
    return Result(
        path=directory,
        run=args.run,
        location=args.location,
        time=now,
        ok=ok,
        reason=line[:2000],
        checkpoint=item.name if item else None,
        step=item.step if item else None,
        verified_step=verified[0],
        verified_time=verified[1],
        verified_checkpoint=verified[2],
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _bad(message: str) -> int:
    print(f"trainguard verify: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT
