"""Fault injection: a writer SIGKILLed at every filesystem operation of ``save`` and ``mirror``
(and at random moments from outside), after which no final-named file may be partial,
``latest()`` must name the last complete step, and the real exporter must agree with it.

How the kill points cover the phases: tests/helpers/ckpt_child.py wraps the ``os`` functions the
library calls (open, write, ftruncate, fsync, replace, unlink, mkdir, close, copy_file_range)
and kills itself right before the k-th one, for every k of a dry run's trace, and in the middle
of every data write or copy (half of it done). The trace labels each operation with what it
touches, and the test asserts that kills landed in every phase: opening the .part, data writes,
data fsync, the rename, the directory fsync, and the manifest record's write, fsync, rename and
directory fsync. A few kills are also sent by the parent at random moments of a throttled run.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.ckpt_child import payload
from helpers.exporter_proc import Exporter, child_env, value
from helpers.paths import HELPERS
from helpers.wait import wait_for
from trainguard.checkpoint import latest, mirror, prune, save
from trainguard.shared.manifest import MANIFEST_DIR, record_path

CHILD = HELPERS / "ckpt_child.py"
RUN = "fi"

SAVE_PHASES = {
    "open:part",
    "ftruncate:part",
    "write:part",
    "fsync:part",
    "replace:part",
    "fsync:dir",
    "open:manifest",
    "write:manifest",
    "fsync:manifest",
    "replace:manifest",
    "fsync:manifest-dir",
}
MIRROR_PHASES = (SAVE_PHASES - {"write:part"}) | {"copy_file_range:part", "open:file"}


def child(
    *args: str,
    kill_at: int = -1,
    partial: bool = False,
    trace: Path | None = None,
    throttle: float = 0.0,
) -> subprocess.Popen[bytes]:
    """One writer in an interpreter of its own."""
    cmd = [sys.executable, str(CHILD), *writer_args(args, kill_at, partial, trace, throttle)]
    return subprocess.Popen(cmd, env=child_env())


def writer_args(
    args: tuple[str, ...], kill_at: int, partial: bool, trace: Path | None, throttle: float
) -> list[str]:
    out = [*args, f"--kill-at={kill_at}", f"--throttle={throttle}"]
    if partial:
        out.append("--partial")
    if trace is not None:
        out.append(f"--trace={trace}")
    return out


class Writers:
    """helpers/ckpt_child.py as a fork server: the same writers, each forked from one process
    that imported everything once, instead of a new interpreter for each of the hundreds."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), "serve"],
            env=child_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._buf = b""

    def start(
        self,
        *args: str,
        kill_at: int = -1,
        partial: bool = False,
        trace: Path | None = None,
        throttle: float = 0.0,
    ) -> int:
        """Fork a writer; its pid, which stays its own (unreaped) until :meth:`wait`."""
        self._send(json.dumps(writer_args(args, kill_at, partial, trace, throttle)))
        return int(self._expect("pid"))

    def wait(self, timeout: float = 120) -> int:
        """The writer's exit status as subprocess gives it (-9: SIGKILL)."""
        self._send("wait")
        return int(self._expect("exit", timeout))

    def _send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def _expect(self, word: str, timeout: float = 120) -> str:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()

        def line() -> bool:
            if b"\n" not in self._buf and select.select([fd], [], [], 0.1)[0]:
                chunk = os.read(fd, 4096)
                assert chunk, f"the writers' server exited {self.proc.poll()}"
                self._buf += chunk
            return b"\n" in self._buf

        wait_for(line, timeout, interval=0, what=f"a line from the writers' server ({word})")
        line, self._buf = self._buf.split(b"\n", 1)
        got, _, rest = line.decode().partition(" ")
        assert got == word, line
        return rest

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def dry_run(writers: Writers, tmp_path: Path, *args: str) -> list[str]:
    """The labels of every operation of one uninterrupted call."""
    trace = tmp_path / "dry.trace"
    trace.unlink(missing_ok=True)
    writers.start(*args, trace=trace)
    assert writers.wait() == 0
    return [line.split(" ", 1)[1] for line in trace.read_text().splitlines()]


def assert_order(ops: list[str], *labels: str) -> None:
    """A SIGKILL keeps the page cache, so it cannot show a missing fsync; the order of the
    operations can: each label must occur, after the previous one."""
    at = -1
    for label in labels:
        assert label in ops[at + 1 :], f"{label} missing after position {at}: {ops}"
        at = ops.index(label, at + 1)


def kill_plan(ops: list[str], partial_kinds: tuple[str, ...]) -> list[tuple[int, bool]]:
    """Before every operation, after the last one (a clean finish), and in the middle of every
    data write or copy."""
    plan = [(k, False) for k in range(len(ops) + 1)]
    plan += [(k, True) for k, op in enumerate(ops) if op.split(":")[0] in partial_kinds]
    return plan


def kill_once(
    writers: Writers,
    tmp_path: Path,
    args: list[str],
    k: int,
    partial: bool,
    n_ops: int,
    rng: random.Random,
) -> str | None:
    """Run one writer to be killed at its k-th operation (halfway through it when ``partial``),
    or, for k < 0, by this process at a random moment of a throttled run. Returns the label of
    the operation it was killed at, when the writer killed itself."""
    trace = tmp_path / "kill.trace"
    trace.unlink(missing_ok=True)
    if k >= 0:
        writers.start(*args, kill_at=k, partial=partial, trace=trace)
        rc = writers.wait()
        assert rc == (0 if k == n_ops else -signal.SIGKILL), (args, k, rc)
    else:
        pid = writers.start(*args, throttle=0.002)
        time.sleep(rng.uniform(0.05, 0.3))  # a random moment: the point of these kills
        os.kill(pid, signal.SIGKILL)  # not reaped before wait(): still this writer's pid
        writers.wait()  # killed, or finished before the signal came
    text = trace.read_text() if trace.exists() else ""
    return text.split()[1] if text else None


def committed(d: Path, name: str, data: bytes) -> bool:
    """Independent of the library: the file holds all of ``data`` and a record says so."""
    try:
        rec = json.loads(record_path(d, name).read_bytes())
        content = (d / name).read_bytes()
    except FileNotFoundError:
        return False
    return (
        content == data
        and rec["size"] == len(data)
        and rec["sha256"] == hashlib.sha256(data).hexdigest()
    )


def assert_whole_or_absent(path: Path, data: bytes) -> None:
    if path.exists():
        assert path.read_bytes() == data, f"{path} has a final name but partial content"


def check_exporter(exp: Exporter, location: str, expected: int | None) -> None:
    s = exp.scrape()
    assert value(s, "trainguard_checkpoint_location_up", run=RUN, location=location) == 1
    assert value(s, "trainguard_checkpoint_last_step", run=RUN, location=location) == expected
    for name in ("truncated_files", "oversized_files", "hash_mismatch_files"):
        got = value(s, f"trainguard_checkpoint_{name}", run=RUN, location=location)
        assert got == 0, (name, location, got)


@pytest.mark.slow
def test_kill_at_every_operation_of_save_and_mirror(tmp_path: Path) -> None:
    p, m = tmp_path / "p", tmp_path / "m"
    p.mkdir()
    m.mkdir()
    save(payload(0), p / "step_0.bin")  # the manifest directories exist from here on, so
    mirror(p / "step_0.bin", m)  # every call has the same sequence of operations
    cfg = tmp_path / "tg.yml"
    cfg.write_text(
        f"runs:\n  - name: {RUN}\n    checkpoints: {{primary: {p}, mirrors: {{backup: {m}}}}}\n"
        "checkpoints: {grace_period: 1s}\n"
    )
    rng = random.Random(20240914)
    exp = Exporter(args=[f"--config.file={cfg}"], state_dir=tmp_path / "state")
    writers = Writers()
    try:
        # --- save ------------------------------------------------------------------------
        ops = dry_run(writers, tmp_path, "save", str(p), "1")
        assert_order(ops, "open:part", "write:part", "fsync:part", "replace:part", "fsync:dir")
        assert_order(
            ops,
            "fsync:dir",
            "write:manifest",
            "fsync:manifest",
            "replace:manifest",
            "fsync:manifest-dir",
        )
        commit_at = ops.index("replace:manifest")
        complete = {0, 1}
        plan = kill_plan(ops, ("write",))
        plan += [(-1, False)] * 10  # killed from outside at a random moment
        killed_in: set[str] = set()
        for i, (k, partial) in enumerate(plan):
            step = 10 + i
            label = kill_once(
                writers, tmp_path, ["save", str(p), str(step)], k, partial, len(ops), rng
            )
            if label:
                killed_in.add(label)
            data = payload(step)
            assert_whole_or_absent(p / f"step_{step}.bin", data)
            if committed(p, f"step_{step}.bin", data):
                complete.add(step)
            if k >= 0:  # the commit point is the record's rename, and nothing else
                assert (step in complete) == (k > commit_at), k
            found = latest(p)
            assert found is not None and found.step == max(complete)
            check_exporter(exp, "primary", max(complete))
        assert len(plan) >= 100
        assert killed_in >= SAVE_PHASES, SAVE_PHASES - killed_in

        # --- mirror ----------------------------------------------------------------------
        # one source per kill point: the copy's operations, then the save outcome's record
        # in the state directory (trainguard.checkpoint.outcomes), plus a margin
        sources = list(range(1000, 1000 + 150))
        for step in sources:
            save(payload(step), p / f"step_{step}.bin")
        ops = dry_run(writers, tmp_path, "mirror", str(p / "step_1000.bin"), str(m))
        assert_order(
            ops,
            "open:file",
            "open:part",
            "copy_file_range:part",
            "fsync:part",
            "replace:part",
            "fsync:dir",
            "write:manifest",
            "fsync:manifest",
            "replace:manifest",
            "fsync:manifest-dir",
        )
        rename_at = next(
            i for i, op in enumerate(ops) if op.startswith("replace:") and op != "replace:manifest"
        )
        mirrored = {0, 1000}
        plan = kill_plan(ops, ("copy_file_range",)) + [(-1, False)] * 10
        assert len(plan) <= len(sources) - 1
        killed_in = set()
        for (k, partial), step in zip(plan, sources[1:], strict=False):
            src = p / f"step_{step}.bin"
            label = kill_once(
                writers, tmp_path, ["mirror", str(src), str(m)], k, partial, len(ops), rng
            )
            if label:
                killed_in.add(label)
            assert_whole_or_absent(m / src.name, payload(step))
            # a mirror file is complete from its rename on: before its own record lands, the
            # primary's record of the same name vouches for its size
            if (m / src.name).exists():
                mirrored.add(step)
            if k >= 0:
                assert (step in mirrored) == (k > rename_at), k
            found = latest(m, primary=p)
            assert found is not None and found.step == max(mirrored)
            check_exporter(exp, "backup", max(mirrored))
        assert len(plan) >= 100
        assert killed_in >= MIRROR_PHASES, MIRROR_PHASES - killed_in
        # every final name in both directories holds a whole checkpoint
        for d in (p, m):
            for f in d.iterdir():
                if f.name != MANIFEST_DIR and not f.name.endswith(".part"):
                    assert f.read_bytes() == payload(int(f.name[5:].split(".")[0])), f
    finally:
        writers.close()
        exp.stop()
        shutil.rmtree(tmp_path, ignore_errors=True)


def test_prune_while_a_copy_is_in_flight(tmp_path: Path) -> None:
    p, m = tmp_path / "p", tmp_path / "m"
    p.mkdir()
    m.mkdir()
    for step in (1, 2, 3):
        save(payload(step), p / f"step_{step}.bin")
    # a slow mirror of the oldest step: it holds its source open and its .part locked
    trace = tmp_path / "mirror.trace"
    proc = child("mirror", str(p / "step_1.bin"), str(m), throttle=0.01, trace=trace)
    try:
        # held mid-copy: stopped once its trace shows the copy under way (the .part opened
        # and locked, the source locked before it) and the rename not yet done
        def held() -> bool:
            assert proc.poll() is None
            proc.send_signal(signal.SIGSTOP)
            ops = trace.read_text() if trace.exists() else ""
            assert "replace:part" not in ops, "the copy finished before it could be held"
            if any(f"{op}:part" in ops for op in ("copy_file_range", "sendfile", "write")):
                return True
            proc.send_signal(signal.SIGCONT)
            return False

        wait_for(held, 60, 0.005, "the mirror held mid-copy")
        deleted = prune(p, keep=1, mirrors=[m], grace=0)
        assert deleted == [p / "step_2.bin"]  # not step 1: it is being copied
        assert (p / "step_1.bin").exists() and (m / "step_1.bin.part").exists()
        # a plain copier writing straight to the final name, within the grace period
        (m / "step_0.bin").write_bytes(b"copy in progress")
        assert prune(p, keep=1, mirrors=[m], grace=300) == []
        proc.send_signal(signal.SIGCONT)
        assert proc.wait(120) == 0
    finally:
        proc.kill()
        proc.wait()
    assert (m / "step_1.bin").read_bytes() == payload(1)
    assert latest(m).step == 1  # type: ignore[union-attr]
    # once the copy is done, the old step goes from the primary; the mirror keeps its newest
    assert sorted(prune(p, keep=1, mirrors=[m], grace=0)) == [m / "step_0.bin", p / "step_1.bin"]
    assert (m / "step_1.bin").exists()
