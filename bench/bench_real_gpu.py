"""Scrape cost and NVML per-call cost on a real NVIDIA driver (issue 18; the test-NVML figures
are bench/bench_scrape.py's).

    python bench/bench_real_gpu.py [--json OUT] [--scrapes 300] [--rounds 2] [--calls 2000]

With one real CUDA training child alive (``tests/gpu/cuda_child.py``: ``trainguard.Run`` and
1 GiB on GPU 0, so NVML's process lists are not empty and the exporter has one run):

- NVML µs per call, for each NVML call trainguard makes: the three a scrape makes per GPU,
  the ones made when NVML starts (first scrape, or after a failure), and the Xid watcher's.
  Each call timed on its own with ``perf_counter_ns`` (p50, p99, mean), in this process.
- Scrapes of ``trainguard-exporter`` (every collector on) and, when the ``nvitop_exporter``
  module can be imported, of ``nvitop-exporter --interval 1`` on the same GPU: HTTP latency
  p50/p99 as the client sees it with Prometheus's request headers, the exporter process's CPU
  per scrape (for nvitop-exporter this includes its background collection loop, which runs
  whether or not anyone scrapes: its idle CPU per second is reported too), resident memory
  and response size. Rounds alternate the two.

Without a real driver it says why, writes ``{"skipped": reason}`` and exits 0, so that
tests/gpu/run-on-device.sh can always finish its report."""

from __future__ import annotations

import argparse
import contextlib
import gzip
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "exporter")]

from helpers.exporter_proc import child_env, free_port  # noqa: E402
from trainguard.exporter.collectors.gpu.health.fields import SLOW_FIELDS, SlowFields  # noqa: E402
from trainguard.exporter.collectors.gpu.health.nvml import function  # noqa: E402

#: the fields the real-GPU check records the answers of: the exporter's slow fields, and the
#: two power fields (does either equal nvmlDeviceGetPowerUsage on this GPU? the exporter
#: reads power by that call)
CHECKED_FIELDS = [*SLOW_FIELDS, (185, 0), (186, 0)]


def field_answers(handle: Any) -> list[list[int]]:
    """Each checked field's (id, nvmlReturn, value or -1) on this driver and GPU."""
    import pynvml

    return [
        [v.fieldId, v.nvmlReturn, v.value.ullVal if v.valueType == 3 else v.value.uiVal]
        if v.nvmlReturn == 0
        else [v.fieldId, v.nvmlReturn, -1]
        for v in pynvml.nvmlDeviceGetFieldValues(handle, CHECKED_FIELDS)
    ]


#: what Prometheus sends at every scrape (as bench/bench_scrape.py)
SCRAPE_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}


def nvml_problem() -> str | None:
    try:
        import pynvml
    except ImportError as exc:
        return f"pynvml cannot be imported: {exc}"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return f"no NVIDIA driver: {exc}"
    try:
        if "fakenvml" in str(getattr(pynvml.nvmlLib, "_name", "")):
            return "NVML is the test library, not a driver"
        if pynvml.nvmlDeviceGetCount() < 1:
            return "NVML lists no GPU"
    finally:
        pynvml.nvmlShutdown()
    return None


def percentiles(ns: list[int]) -> dict[str, float]:
    ns = sorted(ns)
    return {
        "n": len(ns),
        "p50_us": round(ns[len(ns) // 2] / 1000, 2),
        "p99_us": round(ns[min(len(ns) - 1, int(len(ns) * 0.99))] / 1000, 2),
        "mean_us": round(statistics.fmean(ns) / 1000, 2),
    }


#: seconds one NVML function may be timed for (n calls or this, whichever comes first): a
#: driver whose calls take milliseconds must not eat the device run's budget
CALL_BUDGET_S = 3.0


def time_calls(fn: Callable[[], object], n: int) -> dict[str, float]:
    fn()  # warm
    out = []
    clock = time.perf_counter_ns
    stop = clock() + int(CALL_BUDGET_S * 1e9)
    for _ in range(n):
        t = clock()
        fn()
        out.append(clock() - t)
        if t > stop:
            break
    return percentiles(out)


def nvml_calls(n: int) -> dict[str, Any]:
    """µs per NVML call, for every call trainguard's GPU collector and Xid watcher make."""
    import pynvml

    from trainguard.exporter.collectors.gpu.xid import WAIT_MS

    pynvml.nvmlInit()
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        h = handles[0]
        xid = pynvml.nvmlEventTypeXidCriticalError
        out: dict[str, Any] = {}

        def per_scrape(name: str, fn: Callable[[], object]) -> None:
            out[name] = {"when": "every scrape, per GPU", **time_calls(fn, n)}

        per_scrape("nvmlDeviceGetMemoryInfo", lambda: pynvml.nvmlDeviceGetMemoryInfo(h))
        per_scrape(
            "nvmlDeviceGetComputeRunningProcesses",
            lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(h),
        )
        per_scrape(
            "nvmlDeviceGetGraphicsRunningProcesses",
            lambda: pynvml.nvmlDeviceGetGraphicsRunningProcesses(h),
        )
        # the GPU health reads (exporter/collectors/gpu/health/): which ones this driver and GPU
        # support is part of what only a real GPU can say
        for name, fn in (
            (
                "nvmlDeviceGetCurrentClocksEventReasons",
                pynvml.nvmlDeviceGetCurrentClocksEventReasons,
            ),
            ("nvmlDeviceGetCurrPcieLinkGeneration", pynvml.nvmlDeviceGetCurrPcieLinkGeneration),
            ("nvmlDeviceGetCurrPcieLinkWidth", pynvml.nvmlDeviceGetCurrPcieLinkWidth),
            ("nvmlDeviceGetUtilizationRates", pynvml.nvmlDeviceGetUtilizationRates),
            ("nvmlDeviceGetPowerUsage", pynvml.nvmlDeviceGetPowerUsage),
            ("nvmlDeviceGetEnforcedPowerLimit", pynvml.nvmlDeviceGetEnforcedPowerLimit),
            ("nvmlDeviceGetTemperature", lambda d: pynvml.nvmlDeviceGetTemperature(d, 0)),
            (
                "nvmlDeviceGetTotalEccErrors",
                lambda d: pynvml.nvmlDeviceGetTotalEccErrors(d, 1, pynvml.NVML_VOLATILE_ECC),
            ),
            ("nvmlDeviceGetRemappedRows", pynvml.nvmlDeviceGetRemappedRows),
            # before Ampere (NOT_SUPPORTED since), and NVLink (NOT_SUPPORTED on a PCIe card);
            # read every 30 s by the exporter, not at every scrape
            ("nvmlDeviceGetRetiredPages", lambda d: len(pynvml.nvmlDeviceGetRetiredPages(d, 1))),
            (
                "nvmlDeviceGetRetiredPagesPendingStatus",
                pynvml.nvmlDeviceGetRetiredPagesPendingStatus,
            ),
            ("nvmlDeviceGetNvLinkState", lambda d: pynvml.nvmlDeviceGetNvLinkState(d, 0)),
            (
                "nvmlDeviceGetNvLinkErrorCounter",
                lambda d: pynvml.nvmlDeviceGetNvLinkErrorCounter(d, 0, 0),
            ),
            # the exporter's one call per GPU and slow read (ECC, remapped rows, retired
            # pages: gpu_health_fields.py), as it makes it; which fields answer is recorded
            (
                "nvmlDeviceGetFieldValues",
                partial(SlowFields().read, function("nvmlDeviceGetFieldValues")),
            ),
            ("nvmlDeviceGetFieldValues (each field's answer)", field_answers),
        ):
            try:
                out[name + " (health)"] = {"when": "what it read", "value": repr(fn(h))}
                per_scrape(name, partial(fn, h))
            except pynvml.NVMLError as exc:
                out[name + " (health)"] = {"when": "what it read", "error": type(exc).__name__}
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        out["processes_listed"] = len(procs)
        if procs:
            pid = procs[0].pid
            out["psutil.pid_exists (not NVML)"] = {
                "when": "every scrape, per listed process",
                **time_calls(lambda: psutil.pid_exists(pid), n),
            }
        start = "when NVML starts (first scrape, after a failure)"
        few = max(20, n // 20)
        for name, fn in (
            ("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion),
            ("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount),
            ("nvmlDeviceGetHandleByIndex", lambda: pynvml.nvmlDeviceGetHandleByIndex(0)),
            ("nvmlDeviceGetUUID", lambda: pynvml.nvmlDeviceGetUUID(h)),
            ("nvmlDeviceGetName", lambda: pynvml.nvmlDeviceGetName(h)),
        ):
            out[name] = {"when": start, **time_calls(fn, n)}

        def init_cycle() -> None:  # our reference is held outside: count 1 -> 2 -> 1
            pynvml.nvmlInit()
            pynvml.nvmlShutdown()

        out["nvmlInit+nvmlShutdown (nested)"] = {"when": start, **time_calls(init_cycle, few)}

        watch = "Xid watcher start (with NVML start)"
        try:
            out["nvmlDeviceGetSupportedEventTypes"] = {
                "when": watch,
                **time_calls(lambda: pynvml.nvmlDeviceGetSupportedEventTypes(h), few),
            }
            supported = bool(pynvml.nvmlDeviceGetSupportedEventTypes(h) & xid)

            def event_set_cycle() -> None:
                es = pynvml.nvmlEventSetCreate()
                if supported:
                    pynvml.nvmlDeviceRegisterEvents(h, xid, es)
                pynvml.nvmlEventSetFree(es)

            out["nvmlEventSetCreate+RegisterEvents+EventSetFree"] = {
                "when": watch,
                **time_calls(event_set_cycle, few),
            }
            es = pynvml.nvmlEventSetCreate()
            try:
                if supported:
                    pynvml.nvmlDeviceRegisterEvents(h, xid, es)

                def wait0() -> None:
                    with contextlib.suppress(pynvml.NVMLError_Timeout):
                        pynvml.nvmlEventSetWait_v2(es, 0)

                out["nvmlEventSetWait_v2 (0 ms, nothing pending)"] = {
                    "when": f"Xid thread, once per {WAIT_MS} ms wait (cost of the call itself)",
                    **time_calls(wait0, few),
                }
            finally:
                pynvml.nvmlEventSetFree(es)
            out["xid_events_supported"] = supported
        except pynvml.NVMLError as exc:
            out["xid_error"] = str(exc)

        def restart() -> None:  # the process's only reference: NVML really stops and starts
            pynvml.nvmlShutdown()
            pynvml.nvmlInit()

        # last: the handles above may not survive a real restart
        out["nvmlShutdown+nvmlInit (NVML restarted)"] = {
            "when": "after a failed scrape",
            **time_calls(restart, few),
        }
        return out
    finally:
        pynvml.nvmlShutdown()


def get(url: str) -> bytes:
    req = urllib.request.Request(url, headers=SCRAPE_HEADERS)
    with urllib.request.urlopen(req, timeout=30) as r:
        body = bytes(r.read())
        return gzip.decompress(body) if r.headers.get("Content-Encoding") == "gzip" else body


class Server:
    """An exporter process on 127.0.0.1, ready once its metrics path answers."""

    def __init__(self, cmd: list[str], url: str, log: Path) -> None:
        self.url = url
        self.log = log
        with open(log, "w") as f:
            self.proc = subprocess.Popen(cmd, env=child_env(), stdout=f, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{cmd[:4]} exited {self.proc.returncode}: {log.read_text()[-2000:]}"
                )
            try:
                get(url)
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"{url} never answered: {log.read_text()[-2000:]}") from None
                time.sleep(0.1)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def trainguard_server(state_dir: Path, log: Path) -> Server:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "trainguard",
        f"--web.listen-address=127.0.0.1:{port}",
        f"--state.dir={state_dir}",
    ]
    return Server(cmd, f"http://127.0.0.1:{port}/metrics", log)


def nvitop_server(log: Path) -> Server:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "nvitop_exporter",
        "--bind-address=127.0.0.1",
        f"--port={port}",
        "--hostname=bench",
        "--interval=1",
    ]
    return Server(cmd, f"http://127.0.0.1:{port}/metrics", log)


#: seconds of scraping per exporter and round at most (``--scrapes`` or this)
SCRAPE_BUDGET_S = 15.0


def measure(server: Server, scrapes: int) -> dict[str, float]:
    proc = psutil.Process(server.proc.pid)
    for _ in range(10):
        get(server.url)
    cpu0 = sum(proc.cpu_times()[:2])
    t0 = time.perf_counter()
    lat = []
    body = b""
    for _ in range(scrapes):
        t = time.perf_counter()
        body = get(server.url)
        lat.append(time.perf_counter() - t)
        if t - t0 > SCRAPE_BUDGET_S:
            break
    wall = time.perf_counter() - t0
    cpu = sum(proc.cpu_times()[:2]) - cpu0
    scrapes = len(lat)
    lat.sort()
    return {
        "scrapes": scrapes,
        "p50_ms": round(1000 * lat[len(lat) // 2], 3),
        "p99_ms": round(1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))], 3),
        "cpu_ms_per_scrape": round(1000 * cpu / scrapes, 3),
        "wall_s": round(wall, 2),
        "rss_mib": round(proc.memory_info().rss / 2**20, 1),
        "bytes": float(len(body)),
    }


def idle_cpu_ms_per_s(server: Server, seconds: float = 3.0) -> float:
    p = psutil.Process(server.proc.pid)
    c0 = sum(p.cpu_times()[:2])
    time.sleep(seconds)
    return round(1000 * (sum(p.cpu_times()[:2]) - c0) / seconds, 2)


def scrapes(args: argparse.Namespace, state_dir: Path, logs: Path) -> dict[str, Any]:
    kinds: dict[str, Callable[[], Server]] = {
        "trainguard": lambda: trainguard_server(state_dir, logs / "trainguard.log")
    }
    out: dict[str, Any] = {}
    if importlib.util.find_spec("nvitop_exporter") is not None:
        kinds["nvitop-exporter"] = lambda: nvitop_server(logs / "nvitop.log")
    else:
        out["nvitop-exporter"] = {
            "skipped": "nvitop_exporter cannot be imported (carry its wheels: "
            "tests/gpu/fetch-wheels.sh)"
        }
    rounds: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    idle: dict[str, float] = {}
    for _ in range(args.rounds):
        for kind, start in kinds.items():
            try:
                server = start()
            except RuntimeError as exc:
                out[kind] = {"error": str(exc)[-1500:]}
                continue
            try:
                rounds[kind].append(measure(server, args.scrapes))
                if kind not in idle:
                    idle[kind] = idle_cpu_ms_per_s(server)
            finally:
                server.close()
    for kind, runs in rounds.items():
        if not runs:
            continue
        merged = {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}
        merged["scrapes"] = sum(r["scrapes"] for r in runs)
        out[kind] = {**merged, "idle_cpu_ms_per_s": idle.get(kind), "rounds": runs}
    return out


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"Driver {report.get('driver')}, {report.get('gpu')}, nvidia-ml-py "
        f"{report.get('nvidia_ml_py')}, Python {report.get('python')}",
        "",
        "| NVML call | when | p50 µs | p99 µs | mean µs |",
        "|---|---|---|---|---|",
    ]
    for name, v in report.get("nvml_calls", {}).items():
        if isinstance(v, dict):
            lines.append(
                f"| {name} | {v['when']} | {v['p50_us']} | {v['p99_us']} | {v['mean_us']} |"
            )
    lines += [
        "",
        "| exporter | p50 ms | p99 ms | CPU ms/scrape | idle CPU ms/s | RSS MiB | bytes |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, v in report.get("scrape", {}).items():
        if "p50_ms" in v:
            lines.append(
                f"| {kind} | {v['p50_ms']} | {v['p99_ms']} | {v['cpu_ms_per_scrape']} | "
                f"{v['idle_cpu_ms_per_s']} | {v['rss_mib']} | {v['bytes']:.0f} |"
            )
        else:
            lines.append(f"| {kind} | {v.get('skipped') or v.get('error')} | | | | | |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, help="write the report here")
    p.add_argument("--scrapes", type=int, default=300)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--calls", type=int, default=2000, help="timed calls per NVML function")
    args = p.parse_args()
    report: dict[str, Any] = {
        "python": platform.python_version(),
        "date": time.strftime("%F %T %Z"),
    }
    problem = nvml_problem()
    if problem is not None:
        report["skipped"] = problem
        print(f"bench_real_gpu: skipped: {problem}")
    else:
        import pynvml

        from helpers.cuda_proc import CudaChild

        try:
            from importlib.metadata import version

            report["nvidia_ml_py"] = version("nvidia-ml-py")
        except Exception:
            report["nvidia_ml_py"] = "unknown"
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        report["driver"] = str(pynvml.nvmlSystemGetDriverVersion())
        report["gpu"] = str(pynvml.nvmlDeviceGetName(h))
        report["gpus"] = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
            tmpdir = Path(tmp)
            state = tmpdir / "state"
            state.mkdir()
            with CudaChild("bench", state, tmpdir / "child.log") as child:
                child.call("init")
                child.call("alloc", name="a", nbytes=1 << 30)
                child.call("step", step=1)
                report["nvml_calls"] = nvml_calls(args.calls)
                save(args.json, report)  # what is measured survives a timeout of the rest
                report["scrape"] = scrapes(args, state, tmpdir)
        print(markdown(report))
    if args.json:
        save(args.json, report)
    else:
        print(json.dumps(report, indent=2))
    return 0


def save(path: Path | None, report: dict[str, Any]) -> None:
    """Written in place (no temp file: it would be one more file in the device's $OUT)."""
    if path is not None:
        path.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
