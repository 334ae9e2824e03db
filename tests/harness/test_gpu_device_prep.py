"""What issue 18's device run stands on, checked where there is no GPU: the promtool evaluation
the gpu tests use (on samples shaped like the exporter's), the device script's shell, its run
without a GPU (a report that says so, not a crash), the report builder on a GPU-shaped run, and
the benchmark's NVML timing against the test NVML library. The gpu tests themselves are in
tests/gpu/ (skipped here)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.exporter_proc import REPO, Samples
from helpers.nvml_fake import FakeNvmlState
from helpers.promtool_eval import PROMTOOL, promtool_expect, shipped_alert_expr

GIB = 1 << 30
SCRIPT = REPO / "tests" / "gpu" / "run-on-device.sh"
UUID = "GPU-5d6c1b0b-4b3c-fa1e-8f07-2a9b3c4d5e6f"

needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not installed (Debian/Ubuntu: apt-get install prometheus); CI installs it",
)


def sample(
    metric: str, value: float, /, **labels: str
) -> tuple[tuple[str, frozenset[tuple[str, str]]], float]:
    return (metric, frozenset(labels.items())), value


def after_ghost(unattributed: float, processes: float = 1) -> Samples:
    """A scrape as the ghost test takes it: the run dead, one process left on the GPU."""
    gpu = {"gpu": "0", "uuid": UUID}
    return dict(
        [
            sample("trainguard_gpu_info", 1, **gpu, name="NVIDIA H200", driver_version="580.1"),
            sample("trainguard_gpu_memory_total_bytes", 140 * GIB, **gpu),
            sample("trainguard_gpu_memory_used_bytes", unattributed + GIB, **gpu),
            sample("trainguard_gpu_memory_unattributed_bytes", unattributed, **gpu),
            sample("trainguard_gpu_processes", processes, **gpu),
            sample("trainguard_gpu_processes_memory_unknown", 0, **gpu),
            sample("trainguard_run_process_up", 0, run="ghost", rank="0"),
            sample(
                "trainguard_run_allocator_reserved_bytes",
                4 * GIB,
                run="ghost",
                rank="0",
                device="0",
            ),
            sample(
                "trainguard_run_allocator_device_info",
                1,
                run="ghost",
                rank="0",
                device="0",
                uuid=UUID,
            ),
        ]
    )


@needs_promtool
def test_promtool_holds_the_shipped_unattributed_rule_on_a_ghost_scrape(tmp_path: Path) -> None:
    expr = shipped_alert_expr("GPUUnattributedMemory")
    want = ("trainguard_gpu_memory_unattributed_bytes", {"gpu": "0", "uuid": UUID}, 4.5 * GIB)
    result = promtool_expect(after_ghost(4.5 * GIB), expr, [want], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    # and it can fail: under the floor the rule gives nothing, so the same expectation fails
    result = promtool_expect(after_ghost(0.5 * GIB), expr, [want], tmp_path)
    assert result.returncode != 0
    assert "trainguard_gpu_memory_unattributed_bytes" in result.stdout + result.stderr


@needs_promtool
def test_promtool_evaluates_the_recorded_uuid_join(tmp_path: Path) -> None:
    samples = after_ghost(0.0)
    samples[("trainguard_run_process_up", frozenset({"run": "ghost", "rank": "0"}.items()))] = 1
    name = "uuid:trainguard_run_allocator_reserved_bytes:sum"
    result = promtool_expect(samples, name, [(name, {"uuid": UUID}, 4.0 * GIB)], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_device_scripts_shell() -> None:
    for script in (SCRIPT, REPO / "tests" / "gpu" / "fetch-wheels.sh"):
        subprocess.run(["bash", "-n", str(script)], check=True)
        if shutil.which("shellcheck"):
            out = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
            assert out.returncode == 0, out.stdout


def no_driver() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return True
    pynvml.nvmlShutdown()
    return False


@pytest.mark.slow
@pytest.mark.skipif(not no_driver(), reason="an NVIDIA driver is here: the script would test it")
def test_device_script_without_a_gpu_reports_no_cuda(tmp_path: Path) -> None:
    """The whole script, here: it installs nothing (no wheels given), finds no GPU, lets the
    gpu tests skip, skips the benchmark, and writes a report that says NO CUDA/GPU (exit 2),
    within what the device tool returns (at most 8 plain files in $OUT)."""
    out = tmp_path / "out"
    env = {
        **os.environ,
        "OUT": str(out),
        "PYTHON": sys.executable,
        "TG_WHEELS": str(tmp_path / "no-wheels"),
        "TG_SITE": str(tmp_path / "site"),
    }
    env.pop("TRAINGUARD_GPU_REQUIRED", None)
    run = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert run.returncode == 2, run.stdout + run.stderr
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all(re.fullmatch(r"[A-Za-z0-9._-]+", f) for f in files), files
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"].startswith("NO CUDA/GPU") and not report["gpu_ok"]
    assert report["tests"] and {t["outcome"] for t in report["tests"]} == {"skipped"}
    assert all("needs a real NVIDIA GPU" in t["message"] for t in report["tests"])
    assert report["bench"]["skipped"]
    assert "NO CUDA/GPU" in (out / "report.md").read_text()
    assert "NO CUDA/GPU" in run.stdout  # the device tool returns the output's end


def test_report_of_a_gpu_run(tmp_path: Path) -> None:
    """report.py on inputs shaped like a device run's: a pass, a failure with figures, the
    benchmark's tables, a timed-out phase."""
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    probe = {"gpu_ok": True, "nvml": {"driver": "580.159.04"}, "cuda": {"torch": "2.11.0"}}
    (work / "probe.json").write_text(json.dumps(probe))
    (work / "phases.jsonl").write_text(
        '{"phase": "pytest", "rc": 1, "seconds": 90, "limit": 330}\n'
        '{"phase": "bench", "rc": 124, "seconds": 120, "limit": 120}\n'
    )
    (out / "junit.xml").write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="pytest">'
        '<testcase classname="tests.gpu.test_real_gpu" name="test_a" time="1.5"/>'
        '<testcase classname="tests.gpu.test_real_gpu" name="test_b[uuid]" time="2">'
        '<failure message="assert 1 == 2">trace</failure></testcase>'
        "</testsuite></testsuites>"
    )
    (out / "figures.jsonl").write_text(
        json.dumps({"test": "tests/gpu/test_real_gpu.py::test_b[uuid]", "figures": {"ctx": 5}})
    )
    bench = {
        "nvml_calls": {
            "nvmlDeviceGetMemoryInfo": {"when": "w", "p50_us": 1, "p99_us": 2, "mean_us": 1}
        },
        "scrape": {
            "trainguard": {
                "p50_ms": 1,
                "p99_ms": 2,
                "cpu_ms_per_scrape": 1,
                "idle_cpu_ms_per_s": 0,
                "rss_mib": 30,
                "bytes": 100.0,
            },
            "nvitop-exporter": {"skipped": "not carried"},
        },
    }
    (out / "bench.json").write_text(json.dumps(bench))
    run = subprocess.run(
        [sys.executable, str(REPO / "tests" / "gpu" / "report.py"), str(out), str(work)],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "GPU present: NOT all gpu tests passed"
    assert report["counts"] == {"passed": 1, "failed": 1}
    assert report["timed_out_phases"] == ["bench"]
    (failed,) = [t for t in report["tests"] if t["outcome"] == "failed"]
    assert failed["figures"] == {"ctx": 5} and failed["message"] == "assert 1 == 2"
    assert "| nvmlDeviceGetMemoryInfo | w | 1 | 2 | 1 |" in run.stdout
    assert "| nvitop-exporter | not carried |" in run.stdout
    assert "Timed out: bench" in run.stdout


@pytest.mark.slow
def test_bench_nvml_timing_runs_on_the_test_library(tmp_path: Path) -> None:
    """bench_real_gpu's NVML part runs only on the device; here it runs against the test NVML
    library (no timing is judged: the test library costs what it costs), so that the code the
    device run depends on is exercised on every suite run."""
    state = FakeNvmlState(driver_version="580.159.04")
    state.add_gpu(UUID, used=10 * GIB, total=140 * GIB)
    state.add_process(0, os.getpid(), GIB)
    path = state.write(tmp_path / "nvml.state")
    code = (
        "import json, sys; sys.path.insert(0, 'bench'); import bench_real_gpu as b; "
        "print(json.dumps(b.nvml_calls(30)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=state.env(path),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    calls = json.loads(out.stdout)
    per_scrape = {
        k for k, v in calls.items() if isinstance(v, dict) and v["when"].startswith("every")
    }
    assert {
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses",
    } <= per_scrape
    assert calls["processes_listed"] == 1 and calls["xid_events_supported"] is True
    assert "nvmlShutdown+nvmlInit (NVML restarted)" in calls
