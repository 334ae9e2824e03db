"""Cost of the GPU health reads (``trainguard/exporter/collectors/gpu/health/``): each added NVML
call per GPU, the NVML calls per GPU and scrape before and after, and the health reads' share of the
GPU collector's time per scrape, at 8 and 64 GPUs.

    python bench/bench_gpu_health.py [--gpus 8 64] [--procs 100 1000] [--scrapes 30]
    python bench/bench_gpu_health.py --with-without [--scrapes 300]

``--with-without``: the GPU part of a scrape in-process (gather, text writer, gzip at the
exporter's level), scrapes alternating in one child between with and without the health reads
(without: ``GpuHealth.collect`` keeps the GPU's state and reads nothing, as the "same code
without health" commits of bench/RESULTS.md), the garbage collector run between scrapes and off
in the timed part (its pauses land on whichever scrape is unlucky), CPU by ``process_time``.

What is real and what is not: the real pynvml on the test NVML library (tests/fakenvml), which
stat()s its state file at every call and re-parses it only when it changed, so every call costs
about the same here (a few µs of C, plus pynvml's and ctypes' Python); the share of the health
reads therefore follows their share of the calls and of the Python around them. On a real driver
some calls cost
more than others (utilisation and power go to the GPU's firmware); only a GPU can say how much
(bench/bench_real_gpu.py is the place for that check). The collector is the real GpuCollector,
gathered in-process in a child started with the fake library's environment, its health reads
timed by wrapping ``GpuHealth.collect`` with a timer (nothing replaced).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "exporter")]

from helpers.exporter_proc import child_env  # noqa: E402
from helpers.nvml_fake import FakeNvmlState  # noqa: E402

CHILD = r"""
import json, sys, time
import pynvml
from trainguard.exporter.collectors.gpu.health import gpus as gpu_health
from trainguard.exporter.collectors.gpu.collector import GpuCollector
from trainguard.exporter.scrape.context import Scrape

scrapes = int(sys.argv[1])
collector = GpuCollector()
spent, spent_cpu = [], []
original = collector._health.collect
def timed(*args):
    start, cpu = time.perf_counter(), time.process_time()
    original(*args)
    spent[-1] += time.perf_counter() - start
    spent_cpu[-1] += time.process_time() - cpu
collector._health.collect = timed
totals, totals_cpu = [], []
for _ in range(scrapes + 1):  # the first scrape starts NVML and reads what is fixed
    spent.append(0.0)
    spent_cpu.append(0.0)
    scrape = Scrape()
    start, cpu = time.perf_counter(), time.process_time()
    list(collector.gather(scrape))
    totals.append(time.perf_counter() - start)
    totals_cpu.append(time.process_time() - cpu)
    assert not scrape.errors, scrape.errors
series = {"totals": totals[1:], "health": spent[1:], "totals_cpu": totals_cpu[1:],
          "health_cpu": spent_cpu[1:]}
per_call = {}
if sys.argv[2] == "no-per-call":
    print(json.dumps({**series, "per_call": {}}))
    sys.exit(0)
h = pynvml.nvmlDeviceGetHandleByIndex(0)
n = pynvml
from trainguard.exporter.collectors.gpu.health.nvml import function
from trainguard.exporter.collectors.gpu.health.fields import SlowFields
slow_fields, field_values = SlowFields(), function("nvmlDeviceGetFieldValues")
calls = {
    "nvmlDeviceGetCurrentClocksEventReasons": lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h),
    "nvmlDeviceGetCurrPcieLinkGeneration": lambda: pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
    "nvmlDeviceGetCurrPcieLinkWidth": lambda: pynvml.nvmlDeviceGetCurrPcieLinkWidth(h),
    "nvmlDeviceGetUtilizationRates": lambda: pynvml.nvmlDeviceGetUtilizationRates(h),
    "nvmlDeviceGetPowerUsage": lambda: pynvml.nvmlDeviceGetPowerUsage(h),
    "nvmlDeviceGetEnforcedPowerLimit": lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h),
    "nvmlDeviceGetTemperature": lambda: pynvml.nvmlDeviceGetTemperature(h, 0),
    "nvmlDeviceGetTotalEccErrors": lambda: pynvml.nvmlDeviceGetTotalEccErrors(h, 1, 0),
    "nvmlDeviceGetRemappedRows": lambda: pynvml.nvmlDeviceGetRemappedRows(h),
    "nvmlDeviceGetMemoryInfo (existing)": lambda: pynvml.nvmlDeviceGetMemoryInfo(h),
    # the exporter's slow fields in one call, as it reads them (gpu_health_fields.py)
    "nvmlDeviceGetFieldValues (ECC, rows, pages)": lambda: slow_fields.read(field_values, h),
}
for name, fn in calls.items():
    samples = []
    for _ in range(50):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    per_call[name] = sorted(samples)[len(samples) // 2]
print(json.dumps({**series, "per_call": per_call}))
"""


WITH_WITHOUT_CHILD = r"""
import gc, gzip, json, sys, time
from trainguard.exporter.collectors.gpu.collector import GpuCollector
from trainguard.exporter.scrape.exposition import TextWriter
from trainguard.exporter.scrape.context import Scrape
from trainguard.exporter.http.app import GZIP_LEVEL

collector, writer = GpuCollector(), TextWriter()
health = collector._health
read = health.collect
def kept(dev, scrape):  # the GPU stays known (and its lines kept), nothing is read
    health._seen[dev.uuid] = health._devices[dev.uuid]
for _ in range(5):
    writer.render(list(collector.gather(Scrape())))
time.sleep(0.3)  # past the test library's 200 ms of re-parsing a fresh state file
for _ in range(5):
    writer.render(list(collector.gather(Scrape())))
n, pt = int(sys.argv[1]), time.process_time
acc = {"without": [0.0, 0.0, 0.0], "with": [0.0, 0.0, 0.0]}
size = {}
for i in range(2 * n):
    mode = "with" if i % 2 else "without"
    health.collect = read if mode == "with" else kept
    gc.collect()
    gc.disable()
    t0 = pt(); families = list(collector.gather(Scrape()))
    t1 = pt(); page = writer.render(families)
    t2 = pt(); gzip.compress(page, compresslevel=GZIP_LEVEL, mtime=0)
    t3 = pt()
    gc.enable()
    a = acc[mode]
    a[0] += t1 - t0; a[1] += t2 - t1; a[2] += t3 - t2
    size[mode] = len(page)
out = {}
for mode, (g, r, z) in acc.items():
    out[mode] = {"gather_ms": 1e3 * g / n, "render_ms": 1e3 * r / n, "gzip_ms": 1e3 * z / n,
                 "total_ms": 1e3 * (g + r + z) / n, "bytes": size[mode]}
print(json.dumps(out))
"""


def with_without(gpus: int, procs: int, scrapes: int) -> dict[str, object]:
    """The GPU part of a scrape with and without the health reads, in one child."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "nvml.state"
        st = state(gpus, procs)
        st.write(path)
        proc = subprocess.run(
            [sys.executable, "-c", WITH_WITHOUT_CHILD, str(scrapes)],
            env=st.env(path, base=child_env()),
            capture_output=True,
            text=True,
            check=True,
        )
    res = json.loads(proc.stdout)
    without, with_ = res["without"]["total_ms"], res["with"]["total_ms"]
    return {
        "gpus": gpus,
        "procs": procs,
        **{f"{k}_{m}": round(v, 3) for m, r in res.items() for k, v in r.items()},
        "added_ms": round(with_ - without, 3),
        "added_share": round((with_ - without) / without, 3),
    }


def state(gpus: int, procs: int) -> FakeNvmlState:
    st = FakeNvmlState()
    for _ in range(gpus):
        gpu = st.add_gpu(used=20 << 30, utilization=97)
        gpu.clock_event_reasons = 0x4
    for k in range(procs):
        st.add_process(k % gpus, 100_000 + k, 1 << 30)
    return st


HEALTH_SYMBOLS = {
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetGpuMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureThreshold",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkErrorCounter",
    "nvmlDeviceGetFieldValues",
}


def logged_calls(st: FakeNvmlState, path: Path, log: Path, scrapes: int) -> list[str]:
    """The NVML calls of a child that gathers ``scrapes`` + 1 times, from the library's log."""
    log.unlink(missing_ok=True)
    env = st.env(path, log_path=log, base=child_env())
    subprocess.run(
        [sys.executable, "-c", CHILD, str(scrapes), "no-per-call"],
        env=env,
        check=True,
        capture_output=True,
    )
    return [line.split()[0] for line in log.read_text().splitlines() if line]


def run(gpus: int, procs: int, scrapes: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "nvml.state"
        st = state(gpus, procs)
        st.write(path)
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, str(scrapes), "per-call"],
            env=st.env(path, base=child_env()),
            capture_output=True,
            text=True,
            check=True,
        )
        result = json.loads(proc.stdout)
        # one steady scrape's calls: a child gathering 3 times minus one gathering twice
        one, two = (logged_calls(st, path, Path(tmp) / "calls.log", n) for n in (1, 2))
    # the Xid watcher's event waits come at times of their own: not a scrape's calls
    steady = Counter(s for s in two if not s.startswith("nvmlEvent"))
    steady.subtract(s for s in one if not s.startswith("nvmlEvent"))
    totals, health = result["totals"], result["health"]
    health_calls = sum(n for s, n in steady.items() if s in HEALTH_SYMBOLS)
    # the slow reads' calls (every 30 s): the first gather's health calls less a steady one's
    first = Counter(s for s in one if s in HEALTH_SYMBOLS)
    first.subtract({s: 2 * n for s, n in steady.items() if s in HEALTH_SYMBOLS})
    slow = {s: n / gpus for s, n in sorted(first.items()) if n > 0}
    return {
        "gpus": gpus,
        "procs": procs,
        "gather_ms": round(1000 * statistics.median(totals), 2),
        "health_ms": round(1000 * statistics.median(health), 2),
        "health_share": round(
            statistics.median(h / t for h, t in zip(health, totals, strict=True)), 3
        ),
        "gather_cpu_ms": round(1000 * statistics.median(result["totals_cpu"]), 2),
        "health_cpu_ms": round(1000 * statistics.median(result["health_cpu"]), 2),
        "health_cpu_share": round(
            sum(result["health_cpu"]) / max(sum(result["totals_cpu"]), 1e-9), 3
        ),
        "nvml_calls_per_gpu_and_scrape_before": (sum(steady.values()) - health_calls) / gpus,
        "nvml_calls_per_gpu_and_scrape_added": health_calls / gpus,
        "nvml_calls_per_gpu_and_slow_read": sum(slow.values()),
        "slow_read_calls_per_gpu": slow,
        "per_call_us": {k: round(v * 1e6, 1) for k, v in result["per_call"].items()},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--procs", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--scrapes", type=int, default=30)
    ap.add_argument(
        "--with-without",
        action="store_true",
        help="the GPU part of a scrape (gather, render, gzip) with vs without the health reads",
    )
    args = ap.parse_args()
    if len(args.gpus) != len(args.procs):
        ap.error("--gpus and --procs pair up: give as many of each")
    bench = with_without if args.with_without else run
    for gpus, procs in zip(args.gpus, args.procs, strict=True):
        print(json.dumps(bench(gpus, procs, args.scrapes), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
