"""Scrape cost of trainguard-exporter as work grows in each dimension (GPUs, GPU processes,
runs, checkpoint files), at the combined target point, and side by side with nvitop-exporter
on the same test NVML state, inside a network namespace that has only loopback.

    python bench/bench_scrape.py [--quick | --target-only] [--rounds 3] [--scrapes 200]
                                 [--nvitop-python PATH] [--profile] [--json OUT]
                                 [--baseline REV [--configs GxPxRxC,...]]

Re-executes itself under ``unshare -n`` (needs root or user namespaces) so that nothing,
nvitop-exporter's start-up address probe included, can leave 127.0.0.1. nvitop-exporter lives
in its own virtualenv (``--nvitop-python``, default ``/work/venv-nvitop/bin/python``; make one
with ``python -m venv v && v/bin/pip install nvitop-exporter``); without it that part is skipped.

What is real and what is not: NVML is the test library (tests/fakenvml), which stat()s its
state file at every call and re-parses it only when it changed (it does not change during a
run), so a call costs a few µs, about what a driver's does, for both exporters.
Everything else is real: heartbeat files written with
``trainguard.shared.heartbeat.record.write_heartbeat`` carrying the pid and create time of live
``sleep`` processes (and, for every fifth run, of a pid that no longer exists), checkpoint files
with manifest records written with ``trainguard.shared.manifest`` (a primary and a ``backup``
mirror per run, aged past the grace period with ``os.utime``, one orphaned ``.part`` per primary
and one truncated file per mirror), and
the exporter started as ``python -m trainguard`` and scraped over HTTP on 127.0.0.1.

Reports, per configuration (medians over ``--rounds`` rounds, configurations interleaved in a
shuffled order each round): HTTP scrape latency p50/p99 measured by the client, CPU ms the
exporter process spends per scrape, its resident memory, and each collector's own
``trainguard_collector_duration_seconds``; then the idle CPU of the exporter at the target
point, and nvitop-exporter's latency, CPU per scrape, background collection cost (its
``update_device`` loop timed in-process, and its CPU per second with nobody scraping) as
ratios to ours. ``--profile`` also runs the target point's scrape in-process under
pyinstrument and prints the profile; ``--py-spy EXE`` samples our exporter process during the
nvitop comparison's first round (over HTTP, as scraped) and prints the top of that profile.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import platform
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "exporter")]

from helpers.exporter_proc import child_env, free_port  # noqa: E402
from helpers.nvml_fake import FakeNvmlState, build_fake_nvml  # noqa: E402
from helpers.settled_checkpoints import write_settled_checkpoints  # noqa: E402
from trainguard.exporter.collectors.checkpoints.dirwatch import SETTLE_SECONDS  # noqa: E402
from trainguard.shared import procinfo  # noqa: E402
from trainguard.shared.heartbeat.record import (  # noqa: E402
    AllocatorStats,
    Heartbeat,
    heartbeat_filename,
    write_heartbeat,
)

GIB = 1 << 30
LIVE_POOL = 128  # sleep processes: the pids GPU processes and live runs carry
PAYLOAD = 4096  # bytes per checkpoint file
AGE = 3600  # seconds checkpoint files are aged by: well past the 300 s grace period
BASE = {"gpus": 1, "procs": 10, "runs": 1, "ckpts": 10}
TARGET = {"gpus": 8, "procs": 100, "runs": 10, "ckpts": 100}
GRID = {
    "gpus": [1, 8, 64],
    "procs": [10, 100, 1000],
    "runs": [1, 10, 100],
    "ckpts": [10, 100, 1000],
}
DIM_TITLE = {
    "gpus": "GPUs",
    "procs": "GPU processes",
    "runs": "runs (heartbeat files)",
    "ckpts": "checkpoint files per location",
}


def isolated() -> bool:
    """True inside a network namespace whose only interface is loopback."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def reexec_isolated() -> None:
    if os.environ.get("TRAINGUARD_BENCH_REEXEC"):
        sys.exit("bench: still not in a loopback-only network namespace after unshare -n")
    os.environ["TRAINGUARD_BENCH_REEXEC"] = "1"
    cmd = " ".join(map(repr, [sys.executable, *sys.argv]))
    os.execvp("unshare", ["unshare", "-n", "sh", "-c", f"ip link set lo up && exec {cmd}"])


# -- fixtures -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    gpus: int
    procs: int
    runs: int
    ckpts: int

    @property
    def key(self) -> str:
        return f"g{self.gpus}-p{self.procs}-r{self.runs}-c{self.ckpts}"


def dead_pids(n: int) -> list[int]:
    out: list[int] = []
    pid = 3_900_000
    while len(out) < n:
        if not psutil.pid_exists(pid):
            out.append(pid)
        pid += 1
    return out


def gpu_state(gpus: int, procs: int, live: list[int], dead: list[int]) -> FakeNvmlState:
    """Process i runs on GPU i % gpus; the k-th process of a GPU is live sleep k (so the runs'
    pids, the first sleeps, are on every GPU, like data-parallel ranks sharing devices) while
    the pool lasts, then a pid that does not exist."""
    state = FakeNvmlState()
    for _ in range(gpus):
        state.add_gpu(used=40 * GIB)
    for i in range(procs):
        slot = i // gpus
        pid = live[slot] if slot < len(live) else dead[i % len(dead)]
        state.add_process(i % gpus, pid, 256 << 20)
    return state


def write_checkpoints(directory: Path, n: int, *, mirror_of: Path | None) -> None:
    """n settled checkpoints with records; a primary gets one orphaned .part, a mirror one
    truncated copy (the cases the collector exists to catch)."""
    steps = [(i + 1) * 100 for i in range(n)]
    old = write_settled_checkpoints(directory, steps, mirror_of=mirror_of, age=AGE, payload=PAYLOAD)
    if mirror_of is None:
        part = directory / f"step_{(n + 1) * 100}.pt.part"
        part.write_bytes(b"\0" * 100)
        os.utime(part, (old, old))


def build_fixture(root: Path, cfg: Config, live: list[int], dead: list[int]) -> dict[str, str]:
    """Write the NVML state, heartbeats and checkpoints of ``cfg`` under ``root``; returns the
    exporter's environment."""
    root.mkdir(parents=True)
    state_dir = root / "state"
    state_dir.mkdir()
    path = gpu_state(cfg.gpus, cfg.procs, live, dead).write(root / "nvml.state")
    now = time.time()
    common: dict[str, Any] = dict(
        host=socket.gethostname(),
        boot_id=procinfo.boot_id(),
        boot_time=procinfo.boot_time(),
        pid_ns=procinfo.pid_namespace(),
    )
    for k in range(cfg.runs):
        alive = k % 5 != 4  # every fifth run died without finishing
        pid = live[k % len(live)] if alive else dead[k]
        create = psutil.Process(pid).create_time() if alive else now - 7200
        primary = root / "ckpt" / f"run-{k}" / "primary"
        backup = root / "ckpt" / f"run-{k}" / "backup"
        primary.mkdir(parents=True)
        backup.mkdir(parents=True)
        write_checkpoints(primary, cfg.ckpts, mirror_of=None)
        write_checkpoints(backup, cfg.ckpts, mirror_of=primary)
        hb = Heartbeat(
            run=f"run-{k}",
            rank=0,
            pid=pid,
            create_time=create,
            started=now - 3600,
            time=now - (0 if alive else 600),
            step=cfg.ckpts * 100 + 17,
            step_time=now,
            scalars={"loss": 0.5, "tokens_per_s": 12345.0},
            world_size=1,
            checkpoint_dir=str(primary),
            mirrors={"backup": str(backup)},
            log_file=str(root / f"run-{k}.log"),
            allocator=(AllocatorStats(0, 10 * GIB, 12 * GIB, 11 * GIB, 1 << 20, 0, 0),),
            **common,
        )
        write_heartbeat(state_dir / heartbeat_filename(hb.run, hb.rank), hb)
        (root / f"run-{k}.log").write_text("step\n")
    # the verifier's default rate charges a full 4 MiB read chunk per file, so thousands of
    # 4 KiB files would take minutes to hash; the bench only needs them hashed before timing
    (root / "trainguard.yml").write_text("checkpoints:\n  verify_rate: 1000000000000\n")
    env = child_env(FakeNvmlState().env(path))
    env.pop("TRAINGUARD_STATE_DIR", None)
    env["BENCH_STATE_DIR"] = str(state_dir)
    env["BENCH_CONFIG"] = str(root / "trainguard.yml")
    return env


# -- measuring ------------------------------------------------------------------------------


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} never answered")


#: what Prometheus 2.42 sends at every scrape: OpenMetrics preferred, gzip accepted (both
#: exporters then encode OpenMetrics and compress; the client's decompression is timed too)
SCRAPE_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}


#: the client's open connection to each exporter (host, port)
_CONNECTIONS: dict[tuple[str, int], http.client.HTTPConnection] = {}


def get(url: str) -> bytes:
    """Scrape ``url`` as Prometheus does: over one connection kept open between scrapes.

    Go's transport reuses a connection the server keeps open (HTTP/1.1 keep-alive) and opens a
    new one when the server closed it after its answer (wsgiref's HTTP/1.0 server, which
    nvitop-exporter's prometheus_client serves with, closes every connection).
    """
    parts = urllib.parse.urlsplit(url)
    key = (parts.hostname or "", parts.port or 80)
    conn = _CONNECTIONS.get(key)
    if conn is None:
        conn = _CONNECTIONS[key] = http.client.HTTPConnection(*key, timeout=30)
    try:
        conn.request("GET", parts.path, headers=SCRAPE_HEADERS)
        r = conn.getresponse()
    except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
        conn.close()  # closed while idle: once more on a new connection, as Go's transport
        conn.request("GET", parts.path, headers=SCRAPE_HEADERS)
        r = conn.getresponse()
    body = bytes(r.read())
    if r.will_close:
        conn.close()
    return gzip.decompress(body) if r.headers["Content-Encoding"] == "gzip" else body


_DURATION = re.compile(rb'^trainguard_collector_duration_seconds\{collector="(\w+)"\} (\S+)$', re.M)
_SUCCESS = re.compile(rb'^trainguard_collector_success\{collector="(\w+)"\} (\S+)$', re.M)
_PENDING = re.compile(rb"^trainguard_checkpoint_hash_pending_files\{[^}]*\} (\S+)$", re.M)


def settle(url: str, timeout: float = 60) -> None:
    """Scrape until every collector succeeds and the verifier has hashed every file (its
    background work must not be counted as scrape cost), then wait until the checkpoint
    directories' stats have settled (``SETTLE_SECONDS``), as on an exporter that has been
    running for a while: in the first seconds after a directory changes it is listed in full
    at every scrape (that cost is measured separately, see RESULTS.md)."""
    deadline = time.monotonic() + timeout
    body = b""
    while time.monotonic() < deadline:
        body = get(url)
        ok = all(float(v) == 1 for _, v in _SUCCESS.findall(body))
        pending = sum(float(v) for v in _PENDING.findall(body))
        if ok and pending == 0:
            time.sleep(SETTLE_SECONDS + 0.5)
            get(url)  # the read that confirms the settled stats
            return
        time.sleep(0.2)
    raise RuntimeError(f"exporter never settled; last scrape:\n{body.decode()[-3000:]}")


def measure_http(url: str, pid: int, scrapes: int) -> dict[str, float]:
    proc = psutil.Process(pid)
    for _ in range(5):  # warm up
        get(url)
    cpu0 = sum(proc.cpu_times()[:2])
    lat = []
    durations: dict[str, list[float]] = {}
    for _ in range(scrapes):
        t = time.perf_counter()
        body = get(url)
        lat.append(time.perf_counter() - t)
        for name, v in _DURATION.findall(body):
            durations.setdefault(name.decode(), []).append(float(v))
    cpu = sum(proc.cpu_times()[:2]) - cpu0
    lat.sort()
    out = {
        "p50_ms": 1000 * lat[len(lat) // 2],
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))],
        "cpu_ms_per_scrape": 1000 * cpu / scrapes,
        "rss_mb": proc.memory_info().rss / 2**20,
        "bytes": float(len(body)),
    }
    for name, values in durations.items():
        out[f"{name}_ms"] = 1000 * statistics.median(values)
    return out


def idle_cpu_ms_per_s(pid: int, seconds: float) -> float:
    p = psutil.Process(pid)
    c0 = sum(p.cpu_times()[:2])
    time.sleep(seconds)
    return 1000 * (sum(p.cpu_times()[:2]) - c0) / seconds


class Running:
    def __init__(self, cmd: list[str], env: dict[str, str], url: str) -> None:
        self.url = url
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_http(url, self.proc)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        parts = urllib.parse.urlsplit(self.url)
        conn = _CONNECTIONS.pop((parts.hostname or "", parts.port or 80), None)
        if conn is not None:
            conn.close()
        self.proc.terminate()
        self.proc.wait(15)

    def __enter__(self) -> Running:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def ours(env: dict[str, str], server: str = "ours") -> Running:
    """Our exporter; ``server``: another HTTP server under it (bench/http_variants.py)."""
    port = free_port()
    cmd = [
        sys.executable,
        *(
            ["-m", "trainguard"]
            if server == "ours"
            else [str(REPO / "bench" / "http_variants.py"), server]
        ),
        f"--web.listen-address=127.0.0.1:{port}",
        f"--state.dir={env['BENCH_STATE_DIR']}",
        f"--config.file={env['BENCH_CONFIG']}",
    ]
    return Running(cmd, env, f"http://127.0.0.1:{port}/metrics")


def nvitop(python: str, env: dict[str, str]) -> Running:
    port = free_port()
    exe = str(Path(python).parent / "nvitop-exporter")
    cmd = [exe, "--bind-address=127.0.0.1", f"--port={port}", "--hostname=bench", "--interval=1"]
    return Running(cmd, env, f"http://127.0.0.1:{port}/metrics")


OURS_COLLECT = """
import json, time
from trainguard.exporter.collectors.gpu.collector import GpuCollector
from trainguard.exporter.scrape.context import Scrape
c = GpuCollector()
scrape = Scrape()
list(c.gather(scrape))
assert not scrape.errors, scrape.errors
n = {n}
t = time.perf_counter()
for _ in range(n):
    list(c.gather(Scrape()))
print(json.dumps({{"collect_ms": 1000 * (time.perf_counter() - t) / n}}))
"""

NVITOP_COLLECT = """
import json, time
from nvitop import Device
from nvitop_exporter.exporter import PrometheusExporter
devices = Device.from_indices(range(Device.count()))
exp = PrometheusExporter(devices, hostname="bench", interval=1.0)
for d in devices:
    exp.update_device(d)
n = {n}
t = time.perf_counter()
for _ in range(n):
    for d in devices:
        exp.update_device(d)
print(json.dumps({{"collect_ms": 1000 * (time.perf_counter() - t) / n}}))
"""

COLD = """
import gc, json, os, time
from pathlib import Path
from prometheus_client import generate_latest
from trainguard.shared import manifest
from trainguard.exporter.cli import build_collectors, build_registry
from trainguard.exporter.collectors.checkpoints.collector import CheckpointsCollector
from trainguard.exporter.config.model import load_config
config = load_config(os.environ["BENCH_CONFIG"])
collectors = build_collectors(config, Path(os.environ["BENCH_STATE_DIR"]))
registry = build_registry(collectors)
(checkpoints,) = [c for c in collectors if isinstance(c, CheckpointsCollector)]
gc.collect()
gc.freeze()
for _ in range(5):
    generate_latest(registry)
time.sleep(manifest.SETTLE_SECONDS + 1)  # hashes done, directory stats settled
generate_latest(registry)
n = {n}

def per_scrape(before=lambda: None):
    t = time.perf_counter()
    for _ in range(n):
        before()
        generate_latest(registry)
    return round(1000 * (time.perf_counter() - t) / n, 2)

out = {{"steady_ms": per_scrape()}}
# every directory changed since the last scrape: listed in full (what the first seconds after
# a checkpoint is written cost, for the one location written to)
def dirs_changed():
    for cache in [*checkpoints._records.values(), *checkpoints._directories.values()]:
        cache._watch.forget()

out["dirs_changed_ms"] = per_scrape(dirs_changed)
# and every file changed too: every location judged file by file (the cost before the caches)
def all_changed():
    dirs_changed()
    checkpoints._verdicts.clear()

out["all_changed_ms"] = per_scrape(all_changed)
print(json.dumps(out))
"""

PROFILE = """
import os, time
from pathlib import Path
from prometheus_client import generate_latest
from pyinstrument import Profiler
from trainguard.exporter.cli import build_collectors, build_registry
from trainguard.exporter.config.model import load_config
config = load_config(os.environ["BENCH_CONFIG"])
registry = build_registry(build_collectors(config, Path(os.environ["BENCH_STATE_DIR"])))
for _ in range(5):
    generate_latest(registry)
time.sleep(3)  # let the verifier hash every file
n = {n}
t = time.perf_counter()
for _ in range(n):
    generate_latest(registry)
print(f"unprofiled: {{1000 * (time.perf_counter() - t) / n:.2f}} ms per scrape")
p = Profiler(interval=0.0002)
p.start()
for _ in range(n):
    generate_latest(registry)
p.stop()
print(p.output_text(unicode=False, color=False, show_all=False))
"""


def in_process(python: str, code: str, env: dict[str, str]) -> str:
    out = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return out.stdout


def collect_ms(python: str, code: str, env: dict[str, str]) -> float:
    return float(json.loads(in_process(python, code, env).strip().splitlines()[-1])["collect_ms"])


# -- the benchmark ----------------------------------------------------------------------------


def configs(quick: bool) -> list[Config]:
    out = {Config(**TARGET)}
    for dim, values in GRID.items():
        if quick:
            values = values[:2]
        for v in values:
            out.add(Config(**{**BASE, dim: v}))
    return sorted(out, key=lambda c: c.key)


def median_of(rounds: list[dict[str, float]]) -> dict[str, float]:
    keys = set().union(*rounds)
    return {k: statistics.median(r[k] for r in rounds if k in r) for k in keys}


def export_baseline(rev: str, dest: Path) -> Path:
    """This repository's exporter package as of ``rev`` (``git archive``), for a side-by-side
    before/after in one run; returns the directory to put on PYTHONPATH."""
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", rev, "exporter"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest / "exporter"


def with_source(env: dict[str, str], src: Path) -> dict[str, str]:
    return {
        **env,
        "PYTHONPATH": os.pathsep.join([str(src), *env["PYTHONPATH"].split(os.pathsep)[1:]]),
    }


def bench_before_after(
    args: argparse.Namespace, envs: dict[Config, dict[str, str]], baseline: Path
) -> dict[Config, dict[str, dict[str, float]]]:
    """This checkout ("after") and the baseline revision ("before") on the same fixtures,
    alternating which goes first, configurations shuffled each round."""
    results: dict[Config, dict[str, list[dict[str, float]]]] = {
        c: {"before": [], "after": []} for c in envs
    }
    rng = random.Random(11)
    for rnd in range(args.rounds):
        order = list(envs)
        rng.shuffle(order)
        for cfg in order:
            pair = [("after", envs[cfg]), ("before", with_source(envs[cfg], baseline))]
            if rng.random() < 0.5:
                pair.reverse()
            for who, env in pair:
                with ours(env) as exp:
                    settle(exp.url)
                    r = measure_http(exp.url, exp.proc.pid, args.scrapes)
                    r["load1"] = os.getloadavg()[0]
                results[cfg][who].append(r)
                rounded = {k: round(v, 2) for k, v in r.items()}
                print(f"round {rnd + 1} {cfg.key} {who}: {json.dumps(rounded)}", flush=True)
    return {c: {w: median_of(rs) for w, rs in d.items()} for c, d in results.items()}


def before_after_table(res: dict[Config, dict[str, dict[str, float]]]) -> str:
    lines = [
        "| config (GPUs/procs/runs/ckpts) | p50 ms before → after | p99 ms before → after | "
        "CPU ms/scrape before → after | checkpoints ms before → after | RSS MB before → after |",
        "|---|---|---|---|---|---|",
    ]
    for c in sorted(res, key=lambda c: c.key):
        b, a = res[c]["before"], res[c]["after"]
        gain = b["cpu_ms_per_scrape"] / a["cpu_ms_per_scrape"]
        lines.append(
            f"| {c.gpus}/{c.procs}/{c.runs}/{c.ckpts} | {fmt(b['p50_ms'])} → {fmt(a['p50_ms'])} | "
            f"{fmt(b['p99_ms'])} → {fmt(a['p99_ms'])} | {fmt(b['cpu_ms_per_scrape'])} → "
            f"{fmt(a['cpu_ms_per_scrape'])} ({gain:.1f}x) | "
            f"{fmt(b.get('checkpoints_ms', 0))} → {fmt(a.get('checkpoints_ms', 0))} | "
            f"{b['rss_mb']:.0f} → {a['rss_mb']:.0f} |"
        )
    return "\n".join(lines)


def bench_ours(
    args: argparse.Namespace, envs: dict[Config, dict[str, str]]
) -> dict[Config, dict[str, float]]:
    results: dict[Config, list[dict[str, float]]] = {c: [] for c in envs}
    rng = random.Random(7)
    for rnd in range(args.rounds):
        order = list(envs)
        rng.shuffle(order)
        for cfg in order:
            with ours(envs[cfg]) as exp:
                settle(exp.url)
                r = measure_http(exp.url, exp.proc.pid, args.scrapes)
                r["load1"] = os.getloadavg()[0]
            results[cfg].append(r)
            rounded = {k: round(v, 2) for k, v in r.items()}
            print(f"round {rnd + 1} {cfg.key}: {json.dumps(rounded)}", flush=True)
    return {c: median_of(rs) for c, rs in results.items()}


def bench_idle(env: dict[str, str], seconds: float) -> dict[str, float]:
    with ours(env) as exp:
        settle(exp.url)
        for _ in range(20):
            get(exp.url)
        time.sleep(1)
        return {"idle_cpu_ms_per_s": idle_cpu_ms_per_s(exp.proc.pid, seconds)}


class PySpy:
    """py-spy sampling a running exporter (``--gil``: only the thread holding the GIL, i.e.
    Python's own CPU, not the time in NVML's C code), for the profile of a configuration."""

    def __init__(self, exe: str, pid: int, out: Path) -> None:
        self.out = out
        self.proc = subprocess.Popen(
            [exe, "record", "--pid", str(pid), "--rate", "500", "--gil", "--format", "raw",
             "--output", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(1.0)  # attached before the timed scrapes

    def stop(self, top: int = 25) -> str:
        """Stop sampling; the functions with the most samples, inclusive and self."""
        self.proc.send_signal(2)
        self.proc.wait(60)
        return profile_summary(self.out, top)


def profile_summary(raw: Path, top: int = 25) -> str:
    """Share of samples per function, inclusive (on the stack) and self (at its top), from
    py-spy's raw (collapsed stacks) output."""
    own: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        total += n
        frames = stack.split(";")
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for f in set(frames):
            incl[f] = incl.get(f, 0) + n
    lines = [f"py-spy --gil, {total} samples: {raw}", "inclusive:"]
    for what, counts in (("inclusive", incl), ("self", own)):
        if what == "self":
            lines.append("self:")
        for f, n in sorted(counts.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"  {100 * n / max(total, 1):5.1f}% {f}")
    return "\n".join(lines)


def bench_nvitop(
    args: argparse.Namespace, envs: dict[Config, dict[str, str]]
) -> dict[Config, dict[str, dict[str, float]]]:
    """GPU part only: ours with no heartbeats (so no runs, no checkpoints) vs nvitop-exporter,
    same NVML state, interleaved per round."""
    out: dict[Config, dict[str, list[dict[str, float]]]] = {}
    for rnd in range(args.rounds):
        for cfg, env in envs.items():
            gpu_env = dict(env)
            empty = Path(env["BENCH_STATE_DIR"]).parent / "empty-state"
            gpu_env["BENCH_STATE_DIR"] = str(empty)
            nv_env = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "BENCH_STATE_DIR")}
            servers = args.http_servers.split(",")
            slot = out.setdefault(cfg, {"ours": [], "nvitop": []})
            pair: list[tuple[str, Callable[[], Running], str, dict[str, str], str]] = [
                ("ours", lambda e=gpu_env: ours(e), sys.executable, gpu_env, OURS_COLLECT),  # type: ignore[misc]
                ("nvitop", lambda e=nv_env: nvitop(args.nvitop_python, e), args.nvitop_python,  # type: ignore[misc]
                 nv_env, NVITOP_COLLECT),
            ] + [
                (f"ours+{v}", lambda e=gpu_env, v=v: ours(e, v), sys.executable, gpu_env,  # type: ignore[misc]
                 OURS_COLLECT)
                for v in servers if v != "ours"
            ]  # fmt: skip
            for who, *_ in pair:
                slot.setdefault(who, [])
            if rnd % 2:
                pair.reverse()
            for who, start, python, e, code in pair:
                with start() as exp:
                    spy = None
                    if args.py_spy and who == "ours" and rnd == 0:
                        spy = PySpy(args.py_spy, exp.proc.pid, Path(f"{args.py_spy_out}-{cfg.key}"))
                    r = measure_http(exp.url, exp.proc.pid, args.scrapes)
                    if spy is not None:
                        print(spy.stop(), flush=True)
                    r["idle_cpu_ms_per_s"] = idle_cpu_ms_per_s(exp.proc.pid, 5.0)
                r["collect_ms"] = collect_ms(python, code.format(n=20), e)
                slot[who].append(r)
                print(f"round {rnd + 1} nvitop-part {cfg.key} {who}: "
                      + json.dumps({k: round(v, 2) for k, v in r.items()}), flush=True)  # fmt: skip
    return {c: {w: median_of(rs) for w, rs in d.items()} for c, d in out.items()}


def fmt(v: float) -> str:
    return f"{v:.2f}" if v < 100 else f"{v:.0f}"


def dimension_table(dim: str, res: dict[Config, dict[str, float]]) -> str:
    rows = sorted((c for c in res if all(getattr(c, k) == BASE[k] for k in BASE if k != dim)),
                  key=lambda c: getattr(c, dim))  # fmt: skip
    lines = [
        f"| {DIM_TITLE[dim]} | p50 ms | p99 ms | CPU ms/scrape | RSS MB | gpu ms | runs ms | "
        "checkpoints ms | response KB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in rows:
        r = res[c]
        lines.append(
            f"| {getattr(c, dim)} | {fmt(r['p50_ms'])} | {fmt(r['p99_ms'])} | "
            f"{fmt(r['cpu_ms_per_scrape'])} | {r['rss_mb']:.0f} | {fmt(r.get('gpu_ms', 0))} | "
            f"{fmt(r.get('runs_ms', 0))} | {fmt(r.get('checkpoints_ms', 0))} | "
            f"{r['bytes'] / 1024:.0f} |"
        )
    if len(rows) >= 2:
        lo, hi = rows[0], rows[-1]
        dx = getattr(hi, dim) - getattr(lo, dim)
        slope = (res[hi]["cpu_ms_per_scrape"] - res[lo]["cpu_ms_per_scrape"]) / dx
        lines.append("")
        growth = (
            f"CPU per added unit ({getattr(lo, dim)} → {getattr(hi, dim)}): "
            f"{1000 * slope:.1f} µs/scrape"
        )
        if len(rows) == 3:
            mid = rows[1]
            s1 = (res[mid]["cpu_ms_per_scrape"] - res[lo]["cpu_ms_per_scrape"]) / (
                getattr(mid, dim) - getattr(lo, dim)
            )
            s2 = (res[hi]["cpu_ms_per_scrape"] - res[mid]["cpu_ms_per_scrape"]) / (
                getattr(hi, dim) - getattr(mid, dim)
            )
            growth += (
                f"; first step {1000 * s1:.1f} µs/unit, second step {1000 * s2:.1f} µs/unit "
                "(equal: linear; second smaller: better than linear)"
            )
        lines.append(growth)
    return "\n".join(lines)


def nvitop_table(res: dict[Config, dict[str, dict[str, float]]]) -> str:
    lines = [
        "| GPUs | GPU processes | who | p50 / p99 ms | CPU ms/scrape | collect ms (one pass) | "
        "idle CPU ms/s | RSS MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ratios = [
        "| GPUs | GPU processes | p50 nvitop/ours | p99 nvitop/ours | CPU/scrape nvitop/ours | "
        "collect nvitop/ours | RSS nvitop/ours |",
        "|---|---|---|---|---|---|---|",
    ]
    variants = [w for c in res for w in res[c] if w.startswith("ours+")]
    variants = list(dict.fromkeys(variants))
    server_ratios = [
        "| GPUs | GPU processes | server | CPU/scrape ratio to nvitop (goal <= 0.1) | "
        "p99 ratio to nvitop (goal <= 0.2) | p50 ms | p99 ms | CPU ms/scrape |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in sorted(res, key=lambda c: (c.gpus, c.procs)):
        n = res[c]["nvitop"]
        for who in ("ours", *variants):
            r = res[c].get(who)
            if r is None:
                continue
            server_ratios.append(
                f"| {c.gpus} | {c.procs} | {who} | "
                f"{r['cpu_ms_per_scrape'] / n['cpu_ms_per_scrape']:.3f} | "
                f"{r['p99_ms'] / n['p99_ms']:.3f} | {fmt(r['p50_ms'])} | {fmt(r['p99_ms'])} | "
                f"{fmt(r['cpu_ms_per_scrape'])} |"
            )
    for c in sorted(res, key=lambda c: (c.gpus, c.procs)):
        for who in ("ours", "nvitop", *variants):
            if who not in res[c]:
                continue
            r = res[c][who]
            lines.append(
                f"| {c.gpus} | {c.procs} | {who} | {fmt(r['p50_ms'])} / {fmt(r['p99_ms'])} | "
                f"{fmt(r['cpu_ms_per_scrape'])} | {fmt(r['collect_ms'])} | "
                f"{fmt(r['idle_cpu_ms_per_s'])} | {r['rss_mb']:.0f} |"
            )
        o, n = res[c]["ours"], res[c]["nvitop"]
        ratios.append(
            f"| {c.gpus} | {c.procs} | {n['p50_ms'] / o['p50_ms']:.2f}x | "
            f"{n['p99_ms'] / o['p99_ms']:.2f}x | "
            f"{n['cpu_ms_per_scrape'] / o['cpu_ms_per_scrape']:.2f}x | "
            f"{n['collect_ms'] / o['collect_ms']:.2f}x | {n['rss_mb'] / o['rss_mb']:.2f}x |"
        )
    out = "\n".join(lines) + "\n\n" + "\n".join(ratios)
    return out + ("\n\n" + "\n".join(server_ratios) if variants else "")


def cpu_model() -> str:
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--nvitop-python", default="/work/venv-nvitop/bin/python")
    p.add_argument("--scrapes", type=int, default=200, help="timed scrapes per run")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians reported")
    p.add_argument("--quick", action="store_true", help="fewer configurations, 1 round")
    p.add_argument("--target-only", action="store_true", help="only the combined target point")
    p.add_argument(
        "--baseline",
        metavar="REV",
        help="instead of the grid, this checkout against the exporter at git revision REV, "
        "side by side (the same configurations)",
    )
    p.add_argument("--profile", action="store_true", help="also profile the target point")
    p.add_argument(
        "--py-spy",
        metavar="EXE",
        help="in the nvitop comparison's first round, sample our exporter with this py-spy "
        "during the timed scrapes and print the top of the profile",
    )
    p.add_argument("--py-spy-out", default="/tmp/bench-py-spy", help="prefix of its raw files")
    p.add_argument(
        "--nvitop-configs",
        default="1x10,8x100,64x1000",
        help="GPUsxprocesses of the nvitop comparison (default: %(default)s)",
    )
    p.add_argument(
        "--cold",
        action="store_true",
        help="also time the target point in-process with every directory (and file) changed",
    )
    p.add_argument(
        "--configs",
        metavar="GxPxRxC,...",
        help="GPUsxprocessesxrunsxcheckpoints instead of the grid, for --baseline (e.g. "
        "8x100x0x0,64x1000x0x0: the GPU part alone, as in the nvitop comparison)",
    )
    p.add_argument("--only", choices=["ours", "nvitop", "profile"], help="run one part")
    p.add_argument("--json", type=Path, help="write the medians here")
    p.add_argument(
        "--http-servers",
        default="ours",
        help="in the nvitop comparison, also our exporter under these servers (comma-separated "
        "of cheroot, waitress, h11: bench/http_variants.py), each as a ratio to nvitop-exporter",
    )
    p.add_argument("--no-isolation", action="store_true", help="(for debugging only)")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.scrapes = 1, min(args.scrapes, 60)
    if not isolated() and not args.no_isolation:
        reexec_isolated()
    build_fake_nvml()
    live = [subprocess.Popen(["sleep", "3600"]) for _ in range(LIVE_POOL)]
    live_pids = [p.pid for p in live]
    dead = dead_pids(200)
    report: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            cpu = cpu_model()
            print(f"# {time.strftime('%Y-%m-%d %H:%M %Z')} {' '.join(platform.uname())}")
            print(
                f"# {cpu}, {psutil.cpu_count()} CPUs, Python {platform.python_version()}, "
                f"load {os.getloadavg()}, {args.rounds} rounds x {args.scrapes} scrapes"
            )
            target = Config(**TARGET)
            wanted = [target] if args.target_only else configs(args.quick)
            if args.configs:
                wanted = [Config(*map(int, c.split("x"))) for c in args.configs.split(",")]
            envs = {c: build_fixture(tmp / c.key, c, live_pids, dead) for c in wanted}
            if args.baseline:
                src = export_baseline(args.baseline, tmp / "baseline")
                ba = bench_before_after(args, envs, src)
                print(f"\n### before ({args.baseline}) / after (this checkout)\n")
                print(before_after_table(ba))
                report["before_after"] = {c.key: r for c, r in ba.items()}
            elif args.only in (None, "ours"):
                res = bench_ours(args, envs)
                idle = bench_idle(envs[target], 10.0)
                for dim in [] if args.target_only else GRID:
                    print(f"\n### {DIM_TITLE[dim]}\n")
                    print(dimension_table(dim, res))
                t = res[target]
                print(
                    f"\ntarget point {target}: p50 {t['p50_ms']:.2f} ms, "
                    f"p99 {t['p99_ms']:.2f} ms, CPU {t['cpu_ms_per_scrape']:.2f} ms/scrape, "
                    f"RSS {t['rss_mb']:.0f} MB, idle CPU {idle['idle_cpu_ms_per_s']:.3f} ms/s"
                )
                report["ours"] = {c.key: r for c, r in res.items()}
                report["idle"] = idle
            if args.only in (None, "nvitop") and Path(args.nvitop_python).exists():
                nv_cfgs = [tuple(map(int, c.split("x"))) for c in args.nvitop_configs.split(",")]
                if args.quick:
                    nv_cfgs = [c for c in nv_cfgs if c[0] <= 8]
                nv_envs = {}
                for g, n in nv_cfgs:
                    c = Config(g, n, 0, 0)
                    nv_envs[c] = build_fixture(tmp / ("nv-" + c.key), c, live_pids, dead)
                    (tmp / ("nv-" + c.key) / "empty-state").mkdir()
                nres = bench_nvitop(args, nv_envs)
                print("\n### nvitop-exporter, GPU part\n")
                print(nvitop_table(nres))
                report["nvitop"] = {c.key: r for c, r in nres.items()}
            # --cold and --profile time the target point, else the first configuration asked for
            main_env = envs.get(target) or envs[wanted[0]]
            if args.cold:
                cold = json.loads(
                    in_process(sys.executable, COLD.format(n=100), main_env).splitlines()[-1]
                )
                print(f"\ntarget point in-process, ms per scrape: {json.dumps(cold)}")
                report["cold"] = cold
            if args.profile or args.only == "profile":
                print(in_process(sys.executable, PROFILE.format(n=100), main_env))
            if args.json:
                args.json.write_text(json.dumps(report, indent=1, sort_keys=True))
    finally:
        for proc in live:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
