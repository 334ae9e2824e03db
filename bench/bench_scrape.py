"""Scrape cost of trainguard-exporter as work grows, side by side with nvitop-exporter on the
same test NVML state, inside a network namespace that has only loopback.

    python bench/bench_scrape.py [--nvitop-python PATH] [--scrapes 300] [--quick]

Re-executes itself under ``unshare -n`` (needs root or user namespaces) so that nothing,
nvitop-exporter's start-up address probe included, can leave 127.0.0.1. nvitop-exporter lives
in its own virtualenv (``--nvitop-python``, default ``/work/venv-nvitop/bin/python``; make one
with ``python -m venv v && v/bin/pip install nvitop-exporter``).

Reports, per configuration: HTTP scrape latency p50/p99 measured by a client on 127.0.0.1,
CPU seconds the exporter process spends per scrape, the in-process collection cost (one
pass over the GPUs: our collector's ``gather``; nvitop-exporter's ``update_device`` loop, which
its background thread runs every ``--interval``), and resident memory.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "exporter")]

from exporter_proc import child_env, free_port  # noqa: E402
from nvml_fake import FakeNvmlState, build_fake_nvml  # noqa: E402

GIB = 1 << 30


def isolated() -> bool:
    """True inside a network namespace whose only interface is loopback."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def reexec_isolated() -> None:
    if os.environ.get("TRAINGUARD_BENCH_REEXEC"):
        sys.exit("bench: still not in a loopback-only network namespace after unshare -n")
    os.environ["TRAINGUARD_BENCH_REEXEC"] = "1"
    cmd = " ".join(map(repr, [sys.executable, *sys.argv]))
    os.execvp("unshare", ["unshare", "-n", "sh", "-c", f"ip link set lo up && exec {cmd}"])


def gpu_state(gpus: int, procs: int, live_pids: list[int]) -> FakeNvmlState:
    state = FakeNvmlState()
    for _ in range(gpus):
        state.add_gpu(used=40 * GIB)
    for i in range(procs):
        pid = live_pids[i % len(live_pids)] if i < len(live_pids) else 200_000 + i
        state.add_process(i % gpus, pid, 256 << 20)
    return state


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


def measure_http(url: str, pid: int, scrapes: int) -> dict[str, float]:
    proc = psutil.Process(pid)
    for _ in range(5):  # warm up
        urllib.request.urlopen(url, timeout=30).read()
    cpu0 = sum(proc.cpu_times()[:2])
    lat = []
    for _ in range(scrapes):
        t = time.perf_counter()
        with urllib.request.urlopen(url, timeout=30) as r:
            r.read()
        lat.append(time.perf_counter() - t)
    cpu = sum(proc.cpu_times()[:2]) - cpu0
    lat.sort()
    return {
        "p50_ms": 1000 * lat[len(lat) // 2],
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))],
        "cpu_ms_per_scrape": 1000 * cpu / scrapes,
        "rss_mb": proc.memory_info().rss / 2**20,
    }


OURS_COLLECT = """
import json, time
from trainguard.collectors.gpu import GpuCollector
c = GpuCollector()
errors = []
list(c.gather(errors))
assert not errors, errors
n = {n}
t = time.perf_counter()
for _ in range(n):
    list(c.gather(errors))
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


def in_process(python: str, code: str, env: dict[str, str]) -> float:
    out = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return float(json.loads(out.stdout.strip().splitlines()[-1])["collect_ms"])


def run_exporter(
    cmd: list[str], env: dict[str, str], url: str, work: Callable[[int], dict[str, float]]
) -> dict[str, float]:
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(url, proc)
        return work(proc.pid)
    finally:
        proc.terminate()
        proc.wait(15)


def bench_gpu(args: argparse.Namespace, tmp: Path, live: list[int]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    grid = [(1, 10), (8, 10), (8, 100), (8, 1000), (64, 100), (64, 1000)]
    if args.quick:
        grid = [(1, 10), (8, 100)]
    for gpus, procs in grid:
        state = gpu_state(gpus, procs, live)
        path = state.write(tmp / f"nvml-{gpus}-{procs}.state")
        env = child_env(state.env(path))
        env.pop("TRAINGUARD_STATE_DIR", None)
        port = free_port()
        ours = run_exporter(
            [
                sys.executable,
                "-m",
                "trainguard",
                f"--web.listen-address=127.0.0.1:{port}",
                f"--state.dir={tmp / 'empty-state'}",
            ],
            env,
            f"http://127.0.0.1:{port}/metrics",
            lambda pid, port=port: measure_http(  # type: ignore[misc]
                f"http://127.0.0.1:{port}/metrics", pid, args.scrapes
            ),
        )
        ours["collect_ms"] = in_process(sys.executable, OURS_COLLECT.format(n=50), env)
        row: dict[str, object] = {"gpus": gpus, "procs": procs, "ours": ours}
        if args.nvitop_python and Path(args.nvitop_python).exists():
            nport = free_port()
            nv_env = state.env(path)
            nv_bin = str(Path(args.nvitop_python).parent / "nvitop-exporter")
            theirs = run_exporter(
                [
                    nv_bin,
                    "--bind-address=127.0.0.1",
                    f"--port={nport}",
                    "--hostname=bench",
                    "--interval=1",
                ],
                nv_env,
                f"http://127.0.0.1:{nport}/metrics",
                lambda pid, nport=nport: measure_http(  # type: ignore[misc]
                    f"http://127.0.0.1:{nport}/metrics", pid, args.scrapes
                ),
            )
            theirs["collect_ms"] = in_process(
                args.nvitop_python, NVITOP_COLLECT.format(n=20), nv_env
            )
            row["nvitop"] = theirs
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def idle_cpu(tmp: Path, seconds: float) -> float:
    port = free_port()
    env = child_env({"LD_LIBRARY_PATH": str(tmp)})
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainguard",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--state.dir={tmp / 'empty-state'}",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/-/healthy", proc)
        p = psutil.Process(proc.pid)
        c0 = sum(p.cpu_times()[:2])
        time.sleep(seconds)
        return sum(p.cpu_times()[:2]) - c0
    finally:
        proc.terminate()
        proc.wait(15)


def table(rows: list[dict[str, object]]) -> str:
    out = [
        "| GPUs | GPU processes | ours p50 / p99 ms | ours CPU ms/scrape | ours collect ms | "
        "ours RSS MB | nvitop p50 / p99 ms | nvitop CPU ms/scrape | nvitop collect ms | "
        "nvitop RSS MB | collect ratio nvitop/ours |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        o = r["ours"]
        n = r.get("nvitop")
        assert isinstance(o, dict)
        cells = [
            str(r["gpus"]),
            str(r["procs"]),
            f"{o['p50_ms']:.2f} / {o['p99_ms']:.2f}",
            f"{o['cpu_ms_per_scrape']:.2f}",
            f"{o['collect_ms']:.2f}",
            f"{o['rss_mb']:.0f}",
        ]
        if isinstance(n, dict):
            cells += [
                f"{n['p50_ms']:.2f} / {n['p99_ms']:.2f}",
                f"{n['cpu_ms_per_scrape']:.2f}",
                f"{n['collect_ms']:.2f}",
                f"{n['rss_mb']:.0f}",
                f"{n['collect_ms'] / o['collect_ms']:.1f}x",
            ]
        else:
            cells += ["-"] * 5
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--nvitop-python", default="/work/venv-nvitop/bin/python")
    p.add_argument("--scrapes", type=int, default=300)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-isolation", action="store_true", help="(for debugging only)")
    args = p.parse_args()
    if not isolated() and not args.no_isolation:
        reexec_isolated()
    build_fake_nvml()
    live = [subprocess.Popen(["sleep", "600"]) for _ in range(4)]
    try:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            machine = platform.processor() or platform.machine()
            print(f"# {time.strftime('%Y-%m-%d')} {platform.node()} {machine}"
                  f" {psutil.cpu_count()} CPUs, Python {platform.python_version()}")  # fmt: skip
            rows = bench_gpu(args, tmp, [p.pid for p in live])
            print(table(rows))
            print(f"\nidle CPU over 10 s with no scrapes: {idle_cpu(tmp, 10.0):.3f} s")
    finally:
        for proc in live:
            proc.kill()


if __name__ == "__main__":
    main()
