"""One simulated GPU node for bench/bench_fleet.py: the real exporter's /metrics page on an
8-GPU, 8-rank state, captured once, and its relabelled, slowly changing copies.

The capture is real: the test NVML library (tests/fakenvml) with eight H100s, eight live
``sleep`` processes as the ranks of one data-parallel run (one per GPU, each with its
allocator's view of its device), heartbeats written by ``write_heartbeat``, a primary
checkpoint location and a mirror with settled, recorded files, and ``python -m trainguard``
scraped over HTTP once its collectors succeed and its verifier has hashed every file.

A copy for node ``i`` changes what differs between nodes of a fleet (host, instance, run, global
rank, pid, GPU UUID, paths) and, at each scrape, what changes over time: heartbeat and step
timestamps follow the clock, the step counter advances at a steady pace, counters grow, and
measured gauges (memory, utilisation, power, temperature, loss) wander by about 1 % so that
rules compute on changing values rather than on constants.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "exporter")]

from helpers.exporter_proc import Exporter, poll  # noqa: E402
from helpers.nvml_fake import FakeNvmlState  # noqa: E402
from helpers.settled_checkpoints import write_settled_checkpoints  # noqa: E402
from trainguard.shared import procinfo  # noqa: E402
from trainguard.shared.heartbeat.record import (  # noqa: E402
    AllocatorStats,
    Heartbeat,
    heartbeat_filename,
    write_heartbeat,
)

GIB = 1 << 30
GPUS = 8  # and ranks: one per GPU
RUN = "capture"
HOST = "capturehost"
STEPS_PER_S = 2.0  # the simulated run's pace
CKPT_EVERY = 1000  # steps between checkpoints (the captured state has 5 of them)


def _uuid(node: int, gpu: int) -> str:
    return f"GPU-{node:08x}-{gpu:04x}-4000-8000-{node * GPUS + gpu:012x}"


# -- capture ---------------------------------------------------------------------------------


def _state(tmp: Path, pids: list[int]) -> tuple[dict[str, str], list[str]]:
    """The 8-GPU, 8-rank node under ``tmp``: the exporter's environment and arguments."""
    nvml = FakeNvmlState(driver_version="550.54.15")
    for g in range(GPUS):
        gpu = nvml.add_gpu(
            _uuid(0, g),
            used=61 * GIB + GIB // 2,
            utilization=97,
            memory_utilization=45,
            temperature=61,
        )
        gpu.power_mw = 640_000
        nvml.add_process(g, pids[g], 61 * GIB)
    env = nvml.env(nvml.write(tmp / "nvml.state"))

    state_dir = tmp / "state"
    state_dir.mkdir()
    primary, backup = tmp / "ckpt" / RUN / "primary", tmp / "ckpt" / RUN / "backup"
    steps = [CKPT_EVERY * k for k in range(1, 6)]
    write_settled_checkpoints(primary, steps, mirror_of=None, age=3600, payload=4096)
    # a healthy mirror: every copy complete (the capture is of a fleet where nothing is wrong;
    # with mirror_of the helper would cut the newest copy short)
    write_settled_checkpoints(backup, steps, mirror_of=None, age=3600, payload=4096)
    log = tmp / "train.log"
    log.write_text("step 5200\n")
    now = time.time()
    for rank, pid in enumerate(pids):
        hb = Heartbeat(
            run=RUN,
            rank=rank,
            pid=pid,
            create_time=psutil.Process(pid).create_time(),
            host=HOST,
            started=now - 3600,
            time=now,
            step=5200,
            step_time=now,
            scalars={"loss": 1.7, "tokens_per_s": 48_000.0, "lr": 3e-4},
            world_size=GPUS,
            boot_id=procinfo.boot_id(),
            boot_time=procinfo.boot_time(),
            pid_ns=procinfo.pid_namespace(),
            # every rank names the run's locations, as Run(checkpoint_dir=...) on each rank does
            checkpoint_dir=str(primary),
            mirrors={"backup": str(backup)},
            log_file=str(log),
            allocator=(
                AllocatorStats(
                    rank, 52 * GIB, 60 * GIB, 58 * GIB, 1 << 30, 0, 0, _uuid(0, rank), 80 * GIB
                ),
            ),
        )
        write_heartbeat(state_dir / heartbeat_filename(hb.run, hb.rank), hb)
    config = tmp / "trainguard.yml"
    config.write_text("checkpoints:\n  verify_rate: 1000000000000\n")
    return env, [f"--config.file={config}", f"--state.dir={state_dir}"]


def capture(tmp: Path) -> tuple[str, dict[int, int], str]:
    """Start the real exporter on the node's state; return its settled page, the rank of each
    live pid, and ``tmp`` (whose paths appear in labels)."""
    tmp.mkdir(parents=True, exist_ok=True)
    sleepers = [subprocess.Popen(["sleep", "900"]) for _ in range(GPUS)]
    try:
        pids = [p.pid for p in sleepers]
        env, args = _state(tmp, pids)
        with Exporter(args, env=env) as exp:

            def settled(samples: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> bool:
                pending = [v for (n, _), v in samples.items() if n.endswith("hash_pending_files")]
                ok = [v for (n, _), v in samples.items() if n == "trainguard_collector_success"]
                return bool(pending) and not any(pending) and all(v == 1 for v in ok)

            poll(exp, settled, timeout=120)
            time.sleep(6)  # the directories' stats settle (dirwatch.SETTLE_SECONDS)
            exp.get()
            page = exp.get()
        return page, {pid: rank for rank, pid in enumerate(pids)}, str(tmp)
    finally:
        for p in sleepers:
            p.kill()
            p.wait()


# -- templates -------------------------------------------------------------------------------

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

#: how a sample's value moves over time
STATIC, CLOCK, STEP, COUNTER, WANDER = "static", "clock", "step", "counter", "wander"


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float
    kind: str


def kind_of(name: str, labels: dict[str, str], value: float, now: float) -> str:
    """How the simulation moves this sample (see the module's docstring)."""
    if name.startswith("trainguard_") and name.endswith("_timestamp_seconds") and value > now - 120:
        return CLOCK  # written at the capture: a heartbeat, a step, a log line, a scrape
    if name == "trainguard_run_step":
        return STEP
    if name.endswith("_total") and value > 0:
        return COUNTER
    if (
        name.startswith(("trainguard_gpu_", "trainguard_run_allocator_"))
        and name.endswith(("_bytes", "_ratio", "_watts", "_celsius"))
        and value > 1
        and not any(word in name for word in ("total", "max", "limit", "slowdown"))
    ) or name == "trainguard_run_scalar":
        return WANDER
    return STATIC


def parse(page: str, now: float) -> tuple[list[str | Sample], int]:
    """The page as comment lines and samples; also the number of samples (= series)."""
    out: list[str | Sample] = []
    n = 0
    for line in page.splitlines():
        if not line or line.startswith("#"):
            out.append(line)
            continue
        m = _LINE.match(line)
        if m is None:
            raise ValueError(f"cannot parse exposition line {line!r}")
        name, body, raw = m.groups()
        labels = dict(_LABEL.findall(body or ""))
        value = float(raw)
        out.append(Sample(name, tuple(labels.items()), value, kind_of(name, labels, value, now)))
        n += 1
    return out, n


@dataclass(frozen=True)
class Fleet:
    """What varies between nodes: ``nodes_per_job`` nodes share a run (a job), their ranks
    numbered globally."""

    nodes_per_job: int
    pid_rank: dict[int, int]
    capture_dir: str


def relabel(key: str, value: str, node: int, fleet: Fleet) -> str:
    job, slot = divmod(node, fleet.nodes_per_job)
    if key == "host":
        return f"node-{node:04d}"
    if key == "run" and value == RUN:
        return f"job-{job:04d}"
    if key == "rank" and value.isdigit():
        return str(slot * GPUS + int(value))
    if key == "pid" and value.isdigit():
        local = fleet.pid_rank.get(int(value))
        return value if local is None else str(100_000 + node * 64 + local)
    if key == "uuid" and value.startswith("GPU-00000000-"):
        return _uuid(node, int(value.split("-")[2], 16))
    if key == "world_size" and value.isdigit():
        return str(int(value) * fleet.nodes_per_job)
    value = value.replace(fleet.capture_dir, f"/shared/job-{job:04d}")
    return value.replace(RUN, f"job-{job:04d}")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@dataclass(frozen=True)
class Line:
    """A sample of one node, its series rendered; ``phase`` staggers the node's changes."""

    series: bytes
    kind: str
    base: float
    phase: float


Part = bytes | Line


def node_parts(items: list[str | Sample], node: int, fleet: Fleet) -> list[Part]:
    """Node ``node``'s page: runs of static lines joined into one chunk, changing lines apart."""
    parts: list[Part] = []
    static: list[str] = []
    for k, item in enumerate(items):
        if isinstance(item, str):
            static.append(item + "\n")
            continue
        labels = ",".join(
            f'{key}="{_escape(relabel(key, val, node, fleet))}"' for key, val in item.labels
        )
        series = f"{item.name}{{{labels}}}" if labels else item.name
        if item.kind == STATIC:
            static.append(f"{series} {item.value!r}\n")
            continue
        if static:
            parts.append("".join(static).encode())
            static = []
        phase = (node * 7919 + k * 104_729) % 1000 / 1000 * 2 * math.pi
        parts.append(Line(series.encode() + b" ", item.kind, item.value, phase))
    if static:
        parts.append("".join(static).encode())
    return parts


def render(parts: list[Part], captured: float, now: float) -> Iterator[bytes]:
    """The page at ``now`` (``captured``: when the page was scraped)."""
    dt = now - captured
    for part in parts:
        if isinstance(part, bytes):
            yield part
            continue
        if part.kind == CLOCK:
            v = part.base + dt
        elif part.kind == STEP:
            v = float(int(part.base + STEPS_PER_S * dt))
        elif part.kind == COUNTER:
            v = part.base * (1 + dt / 3600)
        else:  # WANDER: about 1 %, over minutes, each node and series at its own phase
            v = part.base * (1 + 0.01 * math.sin(now / 97 + part.phase))
            if part.base.is_integer():
                v = float(round(v))
        yield part.series + repr(v).encode() + b"\n"


def page_summary(items: list[str | Sample]) -> dict[str, int]:
    """Series per node by what they are per: rank, GPU, checkpoint location, or the node."""
    counts = {"per_rank": 0, "per_gpu": 0, "per_location": 0, "per_node": 0, "total": 0}
    for item in items:
        if isinstance(item, str):
            continue
        keys = dict(item.labels)
        if "rank" in keys:
            counts["per_rank"] += 1
        elif "gpu" in keys or "uuid" in keys:
            counts["per_gpu"] += 1
        elif "location" in keys:
            counts["per_location"] += 1
        else:
            counts["per_node"] += 1
        counts["total"] += 1
    return counts


# -- serving ---------------------------------------------------------------------------------


def save_capture(path: Path, page: str, pid_rank: dict[int, int], capture_dir: str) -> None:
    """The capture as one JSON file, for the server process."""
    meta = {"page": page, "pid_rank": pid_rank, "dir": capture_dir, "time": time.time()}
    path.write_text(json.dumps(meta))


def serve(capture_file: Path, nodes: int, nodes_per_job: int, port: int) -> None:
    """Serve node ``i``'s page at ``/node/<i>/metrics`` on 127.0.0.1:``port`` until killed."""
    meta = json.loads(capture_file.read_text())
    captured = float(meta["time"])
    items, _ = parse(meta["page"], captured)
    fleet = Fleet(nodes_per_job, {int(k): v for k, v in meta["pid_rank"].items()}, meta["dir"])
    pages = [node_parts(items, i, fleet) for i in range(nodes)]
    path = re.compile(r"^/node/(\d+)/metrics$")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            m = path.match(self.path)
            if m is None or int(m[1]) >= nodes:
                self.send_error(404)
                return
            body = b"".join(render(pages[int(m[1])], captured, time.time()))
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    print("serving", flush=True)
    server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description="serve N relabelled copies of a captured page")
    parser.add_argument("capture", type=Path)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--nodes-per-job", type=int, default=8)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    serve(args.capture, args.nodes, args.nodes_per_job, args.port)


if __name__ == "__main__":
    main()
