"""The exporter against a real NVIDIA driver and real CUDA training processes (issue 18): the
driver's view of a process against its allocator's, the UUID join, a real OOM and its
snapshot, fragmentation, ghost memory through CUDA IPC, and a SIGKILLed run.

Skipped without a GPU (see conftest.py); tests/gpu/run-on-device.sh runs them on the device
machine. Each test starts the real exporter (real pynvml on the real driver) and real children
(tests/gpu/cuda_child.py); the GPU must be otherwise idle, since device-wide figures (used,
unattributed) are compared before and after. What is measured goes to ``figures``, whether the
test passes or not."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from alerts import site
from helpers.cuda_proc import CudaChild, IpcHolder
from helpers.exporter_proc import Exporter, Samples, poll, select, value
from helpers.promtool_eval import promtool_expect, shipped_alert_expr
from trainguard.shared.gpu_uuid import normalize_gpu_uuid

pytestmark = pytest.mark.gpu

MIB = 1 << 20
GIB = 1 << 30
#: driver memory can take a moment to appear or go after a process changes (the driver
#: tears a context down asynchronously); generous, and returns as soon as it holds
SETTLE_TIMEOUT = 90.0

#: exporter gauge -> the torch.cuda.memory_stats key it carries
ALLOCATOR_GAUGES = {
    "trainguard_run_allocator_allocated_bytes": "allocated_bytes.all.current",
    "trainguard_run_allocator_reserved_bytes": "reserved_bytes.all.current",
    "trainguard_run_allocator_max_allocated_bytes": "allocated_bytes.all.peak",
    "trainguard_run_allocator_inactive_split_bytes": "inactive_split_bytes.all.current",
    "trainguard_run_allocator_alloc_retries_total": "num_alloc_retries",
    "trainguard_run_allocator_ooms_total": "num_ooms",
}


# -- helpers ------------------------------------------------------------------------------


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir()
    return path


@pytest.fixture
def exporter(tmp_path: Path, state_dir: Path) -> Iterator[Exporter]:
    """The real exporter, every collector on, NVML from the real driver."""
    with Exporter(state_dir=state_dir, log_path=tmp_path / "exporter.log") as exp:
        yield exp


def gpus(s: Samples) -> list[dict[str, str]]:
    """trainguard_gpu_info's labels, by index."""
    found = [dict(lbl) for lbl in select(s, "trainguard_gpu_info")]
    return sorted(found, key=lambda g: int(g["gpu"]))


def device(s: Samples, metric: str, gpu: dict[str, str]) -> float | None:
    """A per-GPU sample; ``gpu`` is a trainguard_gpu_info label set (its gpu and uuid)."""
    return value(s, metric, gpu=gpu["gpu"], uuid=gpu["uuid"])


def used(s: Samples, gpu: dict[str, str]) -> float:
    """The GPU's used memory by the driver (always published while NVML works)."""
    v = device(s, "trainguard_gpu_memory_used_bytes", gpu)
    assert v is not None, brief(s)
    return v


def unattributed(s: Samples, gpu: dict[str, str]) -> float:
    """Used memory no live process accounts for (published while every process's memory is
    known, which a Linux driver always reports)."""
    v = device(s, "trainguard_gpu_memory_unattributed_bytes", gpu)
    assert v is not None, brief(s)
    return v


def driver_memory(s: Samples, pid: int) -> dict[str, float]:
    """uuid -> bytes the driver attributes to ``pid``."""
    return {
        dict(lbl)["uuid"]: v
        for lbl, v in select(s, "trainguard_gpu_process_memory_used_bytes", pid=str(pid)).items()
    }


def brief(s: Samples, run: str | None = None) -> str:
    """The scrape's GPU lines and the run's, for an assertion message."""
    lines = []
    for (name, lbl), v in sorted(s.items(), key=lambda kv: (kv[0][0], sorted(kv[0][1]))):
        labels = dict(lbl)
        if name.startswith("trainguard_gpu_") or (
            run is not None and name.startswith("trainguard_run_") and labels.get("run") == run
        ):
            lines.append(f"  {name}{labels} {v:.0f}")
    return "\n".join(lines)


def wait_step(exp: Exporter, run: str, step: int, pid: int) -> Samples:
    """The first scrape that shows ``run`` at ``step`` and the driver listing ``pid``."""
    s = poll(
        exp,
        lambda s: (
            value(s, "trainguard_run_step", run=run, rank="0") == step
            and bool(driver_memory(s, pid))
        ),
        timeout=SETTLE_TIMEOUT,
    )
    assert value(s, "trainguard_run_step", run=run, rank="0") == step and driver_memory(s, pid), (
        f"run {run} never showed step {step} with pid {pid} on a GPU; last scrape:\n{brief(s, run)}"
    )
    return s


def assert_allocator(s: Samples, run: str, stats: dict[str, int]) -> None:
    """The run's allocator gauges are the child's memory_stats at the same step, exactly."""
    got = {m: value(s, m, run=run, rank="0", device="0") for m in ALLOCATOR_GAUGES}
    want = {m: float(stats[k]) for m, k in ALLOCATOR_GAUGES.items()}
    assert got == want


def mib(v: float | None) -> float | None:
    return None if v is None else round(v / MIB, 1)


# -- the tests ------------------------------------------------------------------------------


def test_idle_gpu_facts(exporter: Exporter, figures: dict[str, Any]) -> None:
    """The driver and GPU as the exporter sees them with nothing running; an idle GPU's
    unattributed memory (the driver's own reservation) must stay under the
    GPUUnattributedMemory floor, or the alert fires on every idle GPU."""
    # a CUDA process that just exited (the run's probe) can take a moment to leave the list
    s = poll(
        exporter,
        lambda s: all(device(s, "trainguard_gpu_processes", g) == 0 for g in gpus(s)),
        timeout=SETTLE_TIMEOUT,
    )
    assert value(s, "trainguard_collector_success", collector="gpu") == 1, exporter.log()
    assert value(s, "trainguard_gpu_nvml_available") == 1
    found = gpus(s)
    assert found, brief(s)
    figures["gpus"] = [
        {
            **g,
            "total_mib": mib(device(s, "trainguard_gpu_memory_total_bytes", g)),
            "used_mib": mib(device(s, "trainguard_gpu_memory_used_bytes", g)),
            "unattributed_mib": mib(device(s, "trainguard_gpu_memory_unattributed_bytes", g)),
            "processes": device(s, "trainguard_gpu_processes", g),
            "xid_events_supported": device(s, "trainguard_gpu_xid_events_supported", g),
        }
        for g in found
    ]
    floor = int(site.resolve()["unattributed_floor"])
    for g in found:
        assert device(s, "trainguard_gpu_processes", g) == 0, f"GPU {g} is not idle:\n{brief(s)}"
        unattributed = device(s, "trainguard_gpu_memory_unattributed_bytes", g)
        assert unattributed is not None and unattributed < floor, brief(s)


def test_driver_memory_is_reserved_plus_context(
    exporter: Exporter, state_dir: Path, tmp_path: Path, figures: dict[str, Any]
) -> None:
    """trainguard_gpu_process_memory_used_bytes for the child's pid = its allocator's reserved
    bytes + a CUDA context of fixed size (measured here, reported), at two sizes; the run's
    allocator gauges = torch.cuda.memory_stats read in the child at the same step."""
    with CudaChild("ctx", state_dir, tmp_path / "child.log") as child:
        info = child.call("init")
        figures["torch"] = info
        a1 = child.call("step", step=1)["stats"]
        s1 = wait_step(exporter, "ctx", 1, child.pid)
        ((uuid1, d1),) = driver_memory(s1, child.pid).items()
        context1 = d1 - a1["reserved_bytes.all.current"]
        figures.update(
            step1_driver_mib=mib(d1), step1_reserved_mib=mib(a1["reserved_bytes.all.current"])
        )
        figures["context_mib"] = mib(context1)
        assert_allocator(s1, "ctx", a1)

        child.call("alloc", name="a", nbytes=3 * GIB)
        child.call("alloc", name="b", nbytes=700 * MIB + 12345)
        a2 = child.call("step", step=2)["stats"]
        s2 = wait_step(exporter, "ctx", 2, child.pid)
        ((uuid2, d2),) = driver_memory(s2, child.pid).items()
        context2 = d2 - a2["reserved_bytes.all.current"]
        figures.update(
            step2_driver_mib=mib(d2),
            step2_reserved_mib=mib(a2["reserved_bytes.all.current"]),
            step2_allocated_mib=mib(a2["allocated_bytes.all.current"]),
            context_at_step2_mib=mib(context2),
        )
        assert_allocator(s2, "ctx", a2)
        assert a2["reserved_bytes.all.current"] == a2["memory_reserved"]
        assert a2["reserved_bytes.all.current"] >= 3 * GIB + 700 * MIB
        assert uuid1 == uuid2
        # the context is what the driver holds beyond the allocator: positive, of a sane size,
        # and the same whatever the allocator holds
        assert 0 < context1 < 4 * GIB, brief(s1, "ctx")
        assert abs(context2 - context1) <= 64 * MIB, brief(s2, "ctx")
        # the driver's bytes are put on the run
        (gpu,) = [g for g in gpus(s2) if g["uuid"] == uuid2]
        labels = {"gpu": gpu["gpu"], "uuid": uuid2, "pid": str(child.pid)}
        assert value(s2, "trainguard_gpu_process_memory_used_bytes", **labels, run="ctx") == d2
        assert (
            value(s2, "trainguard_run_gpu_memory_used_bytes", run="ctx", rank="0", gpu=gpu["gpu"])
            == d2
        )


@pytest.mark.parametrize("visible", ["unset", "index", "uuid"])
def test_allocator_device_joins_nvml_gpu_by_uuid(
    exporter: Exporter, state_dir: Path, tmp_path: Path, figures: dict[str, Any], visible: str
) -> None:
    """The allocator's device 0 and the NVML GPU that lists the child are one GPU by UUID,
    with CUDA_VISIBLE_DEVICES unset, set to an index (the last GPU: on a machine with several,
    device 0 is then not NVML's GPU 0) or set to that GPU's UUID; and the rules' join
    (uuid:trainguard_run_allocator_reserved_bytes:sum) puts the reserved bytes on that UUID."""
    target = gpus(exporter.scrape())[-1]
    env = {
        "unset": {},
        "index": {"CUDA_VISIBLE_DEVICES": target["gpu"], "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
        "uuid": {"CUDA_VISIBLE_DEVICES": target["uuid"]},
    }[visible]
    run = f"join-{visible}"
    with CudaChild(run, state_dir, tmp_path / "child.log", env=env) as child:
        info = child.call("init")
        stats = child.call("step", step=1)["stats"]
        s = wait_step(exporter, run, 1, child.pid)
        torch_uuid = normalize_gpu_uuid(info["uuid"])
        ((lbl, one),) = select(s, "trainguard_run_allocator_device_info", run=run).items()
        reported = dict(lbl)["uuid"]
        listed = list(driver_memory(s, child.pid))
        figures.update(visible=env, torch_uuid=info["uuid"], reported=reported, nvml=listed)
        assert one == 1 and dict(lbl)["device"] == "0"
        assert reported == torch_uuid
        assert listed == [reported], brief(s, run)
        assert reported in {g["uuid"] for g in gpus(s)}
        if visible != "unset":
            assert reported == target["uuid"] and info["device_count"] == 1
        result = promtool_expect(
            s,
            "uuid:trainguard_run_allocator_reserved_bytes:sum",
            [
                (
                    "uuid:trainguard_run_allocator_reserved_bytes:sum",
                    {"uuid": reported},
                    float(stats["reserved_bytes.all.current"]),
                )
            ],
            tmp_path,
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_fragmentation_shows_in_inactive_split_bytes(
    exporter: Exporter, state_dir: Path, tmp_path: Path, figures: dict[str, Any]
) -> None:
    """A crafted pattern: eight 512 MiB blocks freed (cached), then eight 300 MiB tensors,
    each split out of one of them: reserved stays 4 GiB while 2.3 GiB is allocated, 8 x 212 MiB
    sit in inactive split blocks, and a 1 GiB request fits none of them (reserved grows). The
    gauges follow memory_stats exactly at each step."""
    with CudaChild("frag", state_dir, tmp_path / "child.log") as child:
        child.call("init")
        for i in range(8):
            child.call("alloc", name=f"big{i}", nbytes=512 * MIB, fill=False)
        child.call("free", names=[f"big{i}" for i in range(8)])
        for i in range(8):
            child.call("alloc", name=f"mid{i}", nbytes=300 * MIB, fill=False)
        a1 = child.call("step", step=1)["stats"]
        s1 = wait_step(exporter, "frag", 1, child.pid)
        child.call("alloc", name="large", nbytes=GIB, fill=False)
        a2 = child.call("step", step=2)["stats"]
        s2 = wait_step(exporter, "frag", 2, child.pid)
        figures.update(
            {
                f"step{n}_{k.split('.')[0]}_mib": mib(a[k])
                for n, a in ((1, a1), (2, a2))
                for k in (
                    "allocated_bytes.all.current",
                    "reserved_bytes.all.current",
                    "inactive_split_bytes.all.current",
                )
            }
        )
        assert_allocator(s1, "frag", a1)
        assert_allocator(s2, "frag", a2)
        reserved = a1["reserved_bytes.all.current"]
        allocated = a1["allocated_bytes.all.current"]
        split = a1["inactive_split_bytes.all.current"]
        assert split >= 8 * 200 * MIB, a1
        assert reserved >= 1.5 * allocated and reserved - allocated >= split, a1
        assert a2["reserved_bytes.all.current"] >= reserved + GIB, (a1, a2)


def test_sigkill_process_up_zero_and_driver_memory_returns(
    exporter: Exporter, state_dir: Path, tmp_path: Path, figures: dict[str, Any]
) -> None:
    """SIGKILL of the CUDA child: the very next scrape says trainguard_run_process_up 0, and
    the driver lets go of the pid and its memory (how long it took is reported, not judged)."""
    s0 = exporter.scrape()
    child = CudaChild("killed", state_dir, tmp_path / "child.log")
    try:
        child.call("init")
        child.call("alloc", name="a", nbytes=2 * GIB)
        child.call("step", step=1)
        s1 = wait_step(exporter, "killed", 1, child.pid)
        ((uuid, held),) = driver_memory(s1, child.pid).items()
        assert value(s1, "trainguard_run_process_up", run="killed", rank="0") == 1
    finally:
        child.kill()
    killed = time.monotonic()
    s2 = exporter.scrape()
    assert value(s2, "trainguard_run_process_up", run="killed", rank="0") == 0, brief(s2, "killed")
    (gpu,) = [g for g in gpus(s2) if g["uuid"] == uuid]
    before = used(s0, gpu)

    def released(s: Samples) -> bool:
        return not driver_memory(s, child.pid) and used(s, gpu) <= before + 256 * MIB

    s3 = poll(exporter, released, timeout=SETTLE_TIMEOUT)
    figures.update(
        held_mib=mib(held),
        used_before_mib=mib(before),
        used_at_kill_mib=mib(used(s1, gpu)),
        used_after_mib=mib(used(s3, gpu)),
        pid_listed_at_first_scrape_after_kill=bool(driver_memory(s2, child.pid)),
        release_seconds=round(time.monotonic() - killed, 2),
    )
    assert released(s3), brief(s3, "killed")


def test_ghost_memory_held_through_cuda_ipc(
    exporter: Exporter, state_dir: Path, tmp_path: Path, figures: dict[str, Any]
) -> None:
    """The run's process shares 4 GiB through CUDA IPC with a second process and is
    SIGKILLed; the second process keeps the mapping. What the driver then shows is the
    finding: the test expects the 4 GiB to stay in use without a live process accounting for
    it (trainguard_gpu_memory_unattributed_bytes rises by it) and the shipped rule over that
    gauge, GPUUnattributedMemory, to hold on the scraped samples (evaluated by promtool). The
    per-rank and per-GPU GPUGhostMemory rules do not apply: one needs the run alive, the other
    a driver that cannot attribute memory (WDDM/WSL)."""
    s0 = exporter.scrape()
    gpu = gpus(s0)[0]
    before, un0 = used(s0, gpu), unattributed(s0, gpu)
    figures.update(unattributed_before_mib=mib(un0), used_before_mib=mib(before))
    child = CudaChild("ghost", state_dir, tmp_path / "child.log")
    holder: IpcHolder | None = None
    try:
        child.call("init")
        child.call("alloc", name="shared", nbytes=4 * GIB)
        child.call("step", step=1)
        wait_step(exporter, "ghost", 1, child.pid)
        payload = child.call("share", name="shared")["payload"]
        holder = IpcHolder(payload, tmp_path / "holder.log")
        assert holder.held["bytes"] == 4 * GIB
        assert holder.held["first"] == holder.held["last"] == 1
        holder_pid = holder.pid
        s1 = poll(exporter, lambda s: bool(driver_memory(s, holder_pid)), timeout=SETTLE_TIMEOUT)
        figures.update(
            both_alive_run_pid_mib=mib(sum(driver_memory(s1, child.pid).values())),
            both_alive_holder_pid_mib=mib(sum(driver_memory(s1, holder_pid).values())),
            both_alive_unattributed_mib=mib(unattributed(s1, gpu)),
            both_alive_used_mib=mib(used(s1, gpu)),
        )
        child.kill()
        s2 = exporter.scrape()
        assert value(s2, "trainguard_run_process_up", run="ghost", rank="0") == 0

        def risen(s: Samples) -> bool:
            return unattributed(s, gpu) >= un0 + 2 * GIB

        s3 = poll(exporter, risen, timeout=SETTLE_TIMEOUT)
        figures.update(
            holder_alive=holder.proc.poll() is None,
            after_kill_unattributed_mib=mib(unattributed(s3, gpu)),
            after_kill_used_mib=mib(used(s3, gpu)),
            after_kill_processes=device(s3, "trainguard_gpu_processes", gpu),
            after_kill_run_pid_listed_mib=mib(sum(driver_memory(s3, child.pid).values())),
            after_kill_holder_pid_mib=mib(sum(driver_memory(s3, holder_pid).values())),
        )
        assert risen(s3), f"no ghost: the driver freed or attributed the memory\n{brief(s3)}"
        labels = {"gpu": gpu["gpu"], "uuid": gpu["uuid"]}
        expected = ("trainguard_gpu_memory_unattributed_bytes", labels, unattributed(s3, gpu))
        result = promtool_expect(
            s3, shipped_alert_expr("GPUUnattributedMemory"), [expected], tmp_path
        )
        figures["promtool"] = (result.stdout + result.stderr)[-1500:]
        assert result.returncode == 0, result.stdout + result.stderr
    finally:
        child.kill()
        if holder is not None:
            holder.close()
    # the ghost goes with the last process that held it
    s4 = poll(exporter, lambda s: used(s, gpu) <= before + 256 * MIB, timeout=SETTLE_TIMEOUT)
    figures["used_after_holder_exit_mib"] = mib(used(s4, gpu))
    assert used(s4, gpu) <= before + 256 * MIB, brief(s4)


def test_real_oom_writes_a_snapshot_and_moves_the_counters(
    exporter: Exporter, state_dir: Path, tmp_path: Path, figures: dict[str, Any]
) -> None:
    """The child allocates 4 GiB at a time until a real torch.OutOfMemoryError inside
    run.capture_oom() with oom_snapshots=True: the snapshot is written next to the heartbeat,
    loads with pickle, holds the OOM in its trace, and PyTorch's memory_viz renders it; the
    snapshot counter and the allocator's OOM and retry counters move (equal to memory_stats)."""
    with CudaChild("oom", state_dir, tmp_path / "child.log", oom_snapshots=True) as child:
        child.call("init")
        a1 = child.call("step", step=1)["stats"]
        s1 = wait_step(exporter, "oom", 1, child.pid)
        assert value(s1, "trainguard_run_memory_snapshots_total", run="oom", rank="0") == 0
        oom = child.call("oom", chunk=4 * GIB, timeout=200)  # under the per-test 240 s
        figures.update(
            chunks=oom["chunks"],
            reached_gib=oom["chunks"] * 4,
            error=oom["error"],
            dump_seconds=oom["dump_seconds"],
        )
        a2 = child.call("step", step=2)["stats"]
        s2 = wait_step(exporter, "oom", 2, child.pid)
        figures.update(num_ooms=a2["num_ooms"], num_alloc_retries=a2["num_alloc_retries"])
        assert oom["error"] and "out of memory" in oom["error"].lower(), oom
        assert oom["chunks"] >= 1
        assert value(s2, "trainguard_run_memory_snapshots_total", run="oom", rank="0") == 1
        assert_allocator(s2, "oom", a2)
        assert a2["num_ooms"] > a1["num_ooms"]
    snapshot = Path(oom["snapshot"])
    assert snapshot.parent == state_dir and snapshot.name.endswith(".oom-1.pickle"), snapshot
    figures["snapshot_mib"] = mib(snapshot.stat().st_size)
    with snapshot.open("rb") as f:
        data = pickle.load(f)
    assert {"segments", "device_traces"} <= set(data), sorted(data)
    actions = {e.get("action") for trace in data["device_traces"] for e in trace}
    figures["trace_actions"] = sorted(str(a) for a in actions)
    assert "oom" in actions
    html = tmp_path / "trace.html"
    viz = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.cuda._memory_viz",
            "trace_plot",
            str(snapshot),
            "-o",
            str(html),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert viz.returncode == 0, viz.stderr[-2000:]
    assert html.stat().st_size > 1000


#: the GPU health series recorded per GPU while busy (exporter/collectors/gpu/health/)
HEALTH_GAUGES = (
    "trainguard_gpu_clock_event_reasons",
    "trainguard_gpu_pcie_link_generation",
    "trainguard_gpu_pcie_link_generation_max",
    "trainguard_gpu_pcie_link_generation_gpu_max",
    "trainguard_gpu_pcie_link_width",
    "trainguard_gpu_pcie_link_width_max",
    "trainguard_gpu_utilization_ratio",
    "trainguard_gpu_power_usage_watts",
    "trainguard_gpu_power_limit_watts",
    "trainguard_gpu_temperature_celsius",
    "trainguard_gpu_temperature_slowdown_celsius",
    "trainguard_gpu_ecc_corrected_errors_total",
    "trainguard_gpu_ecc_uncorrected_errors_total",
    "trainguard_gpu_row_remap_pending",
    "trainguard_gpu_row_remap_failed",
)
#: clock event reasons that page (GPUHardwareSlowdown); the rest are normal states
HARDWARE_REASONS = {"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}


def test_gpu_health_on_a_busy_gpu(
    exporter: Exporter, state_dir: Path, tmp_path: Path, figures: dict[str, Any]
) -> None:
    """The GPU health readings this driver reports, and silence on a healthy busy GPU.

    Which clock event reasons, PCIe link, power, temperature, ECC and row-remap readings a GPU
    reports differs by board and driver: all of it goes to ``figures`` (None where the driver
    answered NOT_SUPPORTED). While a real CUDA process keeps the GPU busy, the readings must be
    consistent (link at or below its maximum, temperature below the GPU's own slowdown point),
    and the rules that judge them (GPUHardwareSlowdown, GPUPcieLinkDegraded), evaluated with
    promtool over the scraped values held for 30 minutes, must return nothing."""
    with CudaChild("health", state_dir, tmp_path / "child.log") as child:
        child.call("init")
        child.send(json.dumps({"op": "busy", "seconds": 40}))

        def busy(s: Samples) -> bool:
            return any(
                (device(s, "trainguard_gpu_utilization_ratio", g) or 0) >= 0.5 for g in gpus(s)
            )

        s = poll(exporter, busy, timeout=SETTLE_TIMEOUT)
        reasons = {
            (dict(lbl)["gpu"], dict(lbl)["reason"])
            for lbl in select(s, "trainguard_gpu_clock_event_reason")
        }
        figures["busy_gpus"] = [
            {"gpu": g["gpu"], **{m: device(s, m, g) for m in HEALTH_GAUGES}} for g in gpus(s)
        ]
        figures["clock_event_reasons"] = sorted(reasons)
        figures["busy_rounds"] = child.answer("busy", 120).get("rounds")
        assert busy(s), brief(s)
        assert not {r for _, r in reasons} & HARDWARE_REASONS, sorted(reasons)
        for g in gpus(s):
            gen, gen_max = (
                device(s, "trainguard_gpu_pcie_link_generation", g),
                device(s, "trainguard_gpu_pcie_link_generation_max", g),
            )
            if gen is not None and gen_max is not None:
                assert 1 <= gen <= gen_max, brief(s)
            temp, slowdown = (
                device(s, "trainguard_gpu_temperature_celsius", g),
                device(s, "trainguard_gpu_temperature_slowdown_celsius", g),
            )
            if temp is not None and slowdown is not None:
                assert temp < slowdown, brief(s)
        for alert in ("GPUHardwareSlowdown", "GPUPcieLinkDegraded"):
            (tmp_path / alert).mkdir()
            result = promtool_expect(s, shipped_alert_expr(alert), [], tmp_path / alert)
            figures[f"promtool_{alert}"] = (result.stdout + result.stderr)[-800:]
            assert result.returncode == 0, result.stdout + result.stderr
