"""The GPU collector against the real pynvml loading the test NVML library, scraped over HTTP."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from helpers.exporter_proc import Exporter, poll, select, value
from helpers.nvml_fake import FakeNvmlState
from helpers.promtool_alerts import firing
from helpers.run_child import own_heartbeat, put, sigkill
from trainguard.run.allocator import allocator_stats

GIB = 1 << 30


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


@pytest.fixture
def live_pids() -> Iterator[list[int]]:
    procs = [sleeper() for _ in range(3)]
    yield [p.pid for p in procs]
    for p in procs:
        p.kill()
        p.wait()


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def two_gpus(live: list[int], dead: int) -> FakeNvmlState:
    a, b, c = live
    state = FakeNvmlState(driver_version="550.54.15")
    state.add_gpu("GPU-aaaaaaaa-0000-0000-0000-000000000000", used=10 * GIB, total=80 * GIB)
    state.add_gpu(
        "GPU-bbbbbbbb-0000-0000-0000-000000000000",
        name="NVIDIA A100-SXM4-40GB",
        used=6 * GIB,
        total=40 * GIB,
    )
    state.add_process(0, a, 4 * GIB)
    state.add_process(0, a, 4 * GIB, kind="graphics")  # C+G: the same process in both lists
    state.add_process(0, b, 1 * GIB, kind="graphics")
    state.add_process(0, dead, 2 * GIB)  # NVML still lists it; its memory is ghost memory
    state.add_process(1, c, 3 * GIB)
    state.add_process(1, 999_999_999 % 4_000_000, None, kind="graphics")  # WDDM: not available
    return state


def test_two_gpus_five_processes(tmp_path: Path, live_pids: list[int]) -> None:
    dead = dead_pid()
    state = two_gpus(live_pids, dead)
    path = state.write(tmp_path / "nvml.state")
    a, b, c = live_pids
    g0 = {"gpu": "0", "uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000000"}
    g1 = {"gpu": "1", "uuid": "GPU-bbbbbbbb-0000-0000-0000-000000000000"}
    with Exporter(env=state.env(path), state_dir=tmp_path / "s") as exp:
        s = exp.scrape()
    assert value(s, "trainguard_collector_success", collector="gpu") == 1
    assert (
        value(
            s,
            "trainguard_gpu_info",
            **g0,
            name="NVIDIA H100 80GB HBM3",
            driver_version="550.54.15",
        )
        == 1
    )
    assert (
        value(
            s, "trainguard_gpu_info", **g1, name="NVIDIA A100-SXM4-40GB", driver_version="550.54.15"
        )
        == 1
    )
    assert value(s, "trainguard_gpu_memory_total_bytes", **g0) == 80 * GIB
    assert value(s, "trainguard_gpu_memory_total_bytes", **g1) == 40 * GIB
    assert value(s, "trainguard_gpu_memory_used_bytes", **g0) == 10 * GIB
    assert value(s, "trainguard_gpu_memory_used_bytes", **g1) == 6 * GIB
    procs = select(s, "trainguard_gpu_process_memory_used_bytes")
    assert {dict(lbl)["pid"]: v for lbl, v in procs.items()} == {
        str(a): 4 * GIB,
        str(b): 1 * GIB,
        str(dead): 2 * GIB,
        str(c): 3 * GIB,
    }
    assert all(dict(lbl)["run"] == "" for lbl in procs)
    assert value(s, "trainguard_gpu_processes_memory_unknown", **g0) == 0
    assert value(s, "trainguard_gpu_processes_memory_unknown", **g1) == 1
    # GPU 0: 10 GiB used, live processes account for 4 + 1; the dead pid's 2 GiB is ghost memory
    assert value(s, "trainguard_gpu_memory_unattributed_bytes", **g0) == 5 * GIB
    # GPU 1: one process's memory is unknown, so what is unattributed is unknown too
    assert value(s, "trainguard_gpu_memory_unattributed_bytes", **g1) is None


def test_gpu_lost_between_scrapes_and_back(tmp_path: Path, live_pids: list[int]) -> None:
    state = two_gpus(live_pids, dead_pid())
    path = state.write(tmp_path / "nvml.state")
    g1 = {"gpu": "1", "uuid": "GPU-bbbbbbbb-0000-0000-0000-000000000000"}
    with Exporter(env=state.env(path), state_dir=tmp_path / "s") as exp:
        assert value(exp.scrape(), "trainguard_gpu_memory_used_bytes", **g1) == 6 * GIB
        state.gpus[1].lost = True
        state.write(path)
        lost = exp.scrape()
        assert value(lost, "trainguard_collector_success", collector="gpu") == 0
        assert value(lost, "trainguard_gpu_memory_used_bytes", **g1) is None
        # the other GPU still answers
        assert value(lost, "trainguard_gpu_memory_used_bytes", gpu="0", uuid=g0_uuid()) == 10 * GIB
        still_lost = exp.scrape()  # the retry finds it still lost
        assert value(still_lost, "trainguard_collector_success", collector="gpu") == 0
        assert value(still_lost, "trainguard_gpu_memory_used_bytes", gpu="0", uuid=g0_uuid())
        state.gpus[1].lost = False
        state.write(path)
        back = exp.scrape()
        assert value(back, "trainguard_collector_success", collector="gpu") == 1
        assert value(back, "trainguard_gpu_memory_used_bytes", **g1) == 6 * GIB
        log = exp.stop()
    assert "collector gpu: GPU 1 (GPU-bbbbbbbb-0000-0000-0000-000000000000): GPU is lost" in log
    assert log.count("collector gpu: GPU 1") == 1, log  # logged when it starts, not per scrape
    assert "collector gpu recovered" in log


def g0_uuid() -> str:
    return "GPU-aaaaaaaa-0000-0000-0000-000000000000"


def test_driver_not_loaded_then_loaded(tmp_path: Path) -> None:
    state = FakeNvmlState(init_error="driver_not_loaded")
    state.add_gpu(g0_uuid(), used=1 * GIB)
    path = state.write(tmp_path / "nvml.state")
    log_path = tmp_path / "calls.log"
    with Exporter(env=state.env(path, log_path=log_path), state_dir=tmp_path / "s") as exp:
        for _ in range(3):
            s = exp.scrape()
            assert value(s, "trainguard_collector_success", collector="gpu") == 0
            assert select(s, "trainguard_gpu_info") == {}
        state.init_error = None
        state.write(path)
        s = exp.scrape()
        assert value(s, "trainguard_collector_success", collector="gpu") == 1
        assert value(s, "trainguard_gpu_memory_used_bytes", gpu="0", uuid=g0_uuid()) == GIB
        exp.scrape()
        log = exp.stop()
    assert log.count("NVML is not available: Driver Not Loaded") == 1, log
    assert "Traceback" not in log
    calls = log_path.read_text().split()
    # once NVML started, later scrapes reuse it instead of initialising again; the fifth is
    # the Xid watcher's own reference, taken once with its event set
    assert calls.count("nvmlInitWithFlags") == 5
    assert calls.count("nvmlEventSetCreate") == 1
    assert calls.count("nvmlDeviceGetHandleByIndex_v2") == 1


def test_no_nvidia_driver_is_not_a_failure(tmp_path: Path) -> None:
    """A checkpoint server or CPU node, watched for runs and checkpoints only: no NVML library
    at all. Not a standing TrainguardCollectorFailing: the collector succeeds with no GPUs, a
    gauge says why there are none, and the log says it once, at info."""
    (tmp_path / "s").mkdir()  # a missing state dir is a warning of its own
    with Exporter(env={"LD_LIBRARY_PATH": str(tmp_path)}, state_dir=tmp_path / "s") as exp:
        for _ in range(3):
            s = exp.scrape()
            assert value(s, "trainguard_collector_success", collector="gpu") == 1
            assert value(s, "trainguard_gpu_nvml_available") == 0
            assert [
                n
                for n, _ in s
                if n.startswith("trainguard_gpu_") and n != "trainguard_gpu_nvml_available"
            ] == []
        log = exp.stop()
    assert log.count("no NVIDIA driver") == 1, log
    (line,) = [line for line in log.splitlines() if "no NVIDIA driver" in line]
    assert "level=INFO" in line and "--no-collector.gpu" in line, line
    assert "level=WARNING" not in log, log


def test_an_installed_driver_that_fails_is_a_failure(tmp_path: Path) -> None:
    """The library loads but the driver does not answer (kernel module not loaded, a
    library/kernel version mismatch after an upgrade): that stays a failure, with no
    nvml_available series (it is not known whether the GPUs are fine)."""
    for error, text in [
        ("driver_not_loaded", "Driver Not Loaded"),
        ("lib_rm_version_mismatch", "RM has detected an NVML/RM version mismatch."),
    ]:
        state = FakeNvmlState(init_error=error)
        state.add_gpu(g0_uuid())
        path = state.write(tmp_path / "nvml.state")
        with Exporter(env=state.env(path), state_dir=tmp_path / "s") as exp:
            s = exp.scrape()
            log = exp.stop()
        assert value(s, "trainguard_collector_success", collector="gpu") == 0, error
        assert value(s, "trainguard_gpu_nvml_available") is None, error
        assert f"NVML is not available: {text}" in log, log
        assert "no NVIDIA driver" not in log, log


def test_nvml_available_once_started(tmp_path: Path) -> None:
    state = FakeNvmlState()
    path = state.write(tmp_path / "nvml.state")  # a driver, no GPU (all of them lost)
    with Exporter(env=state.env(path), state_dir=tmp_path / "s") as exp:
        s = exp.scrape()
    assert value(s, "trainguard_collector_success", collector="gpu") == 1
    assert value(s, "trainguard_gpu_nvml_available") == 1


def test_many_processes_use_the_insufficient_size_protocol(tmp_path: Path) -> None:
    state = FakeNvmlState()
    state.add_gpu(g0_uuid(), used=80 * GIB)
    for pid in range(10_000, 11_000):
        state.add_process(0, pid, 1 << 20)
    path = state.write(tmp_path / "nvml.state")
    with Exporter(env=state.env(path), state_dir=tmp_path / "s") as exp:
        s = exp.scrape()
        assert value(s, "trainguard_collector_success", collector="gpu") == 1
        assert len(select(s, "trainguard_gpu_process_memory_used_bytes")) == 1000
        g0 = {"gpu": "0", "uuid": g0_uuid()}
        # the exporter keeps a buffer per device between scrapes: a list that outgrows it
        # is asked for again, one that shrinks is not padded with stale entries
        for n in (2500, 3):
            state = FakeNvmlState()
            state.add_gpu(g0_uuid(), used=80 * GIB)
            for pid in range(20_000, 20_000 + n):
                state.add_process(0, pid, 2 << 20)
            state.write(path)
            s = poll(exp, lambda s, n=n: value(s, "trainguard_gpu_processes", **g0) == n)
            assert value(s, "trainguard_collector_success", collector="gpu") == 1
            procs = select(s, "trainguard_gpu_process_memory_used_bytes")
            assert sorted(int(dict(k)["pid"]) for k in procs) == list(range(20_000, 20_000 + n))
            assert set(procs.values()) == {2 << 20}


def test_gpu_lost_mid_scrape_publishes_nothing_partial(
    tmp_path: Path, live_pids: list[int]
) -> None:
    """Memory info answers, then the process list fails: that GPU is left out whole, never
    published with a half-known (and so wrongly unattributed) state."""
    state = two_gpus(live_pids, dead_pid())
    path = state.write(tmp_path / "nvml.state")
    with Exporter(env=state.env(path), state_dir=tmp_path / "s") as exp:
        state.fail("nvmlDeviceGetGraphicsRunningProcesses_v3", "gpu_is_lost", gpu=0)
        state.write(path)
        s = exp.scrape()
        assert value(s, "trainguard_collector_success", collector="gpu") == 0
        assert value(s, "trainguard_gpu_memory_used_bytes", gpu="0", uuid=g0_uuid()) is None
        assert value(s, "trainguard_gpu_memory_unattributed_bytes", gpu="0", uuid=g0_uuid()) is None
        assert select(s, "trainguard_gpu_process_memory_used_bytes", gpu="0") == {}
        assert (
            value(
                s,
                "trainguard_gpu_memory_used_bytes",
                gpu="1",
                uuid="GPU-bbbbbbbb-0000-0000-0000-000000000000",
            )
            == 6 * GIB
        )
        state.failures.clear()
        state.write(path)
        s = exp.scrape()
        assert value(s, "trainguard_collector_success", collector="gpu") == 1
        assert (
            value(s, "trainguard_gpu_memory_unattributed_bytes", gpu="0", uuid=g0_uuid()) == 5 * GIB
        )


def test_a_hung_driver_costs_a_scrape_the_timeout_not_the_exporter(
    tmp_path: Path, live_pids: list[int]
) -> None:
    """NVML stops answering (a driver stuck on a GPU in a bad state; here every memory query
    sleeps 5 s holding the library's lock). The scrape answers after --collector.timeout
    without the GPU collector; the next one answers at once instead of queueing behind the
    stuck call; once the call returns, the GPUs are back. Told apart without a stopwatch on
    the client: an exporter that waited for the hang would get the GPUs (the call returns
    after 5 s) and report the collector successful; its own duration figure says whether a
    scrape waited out the 1 s timeout."""
    state = two_gpus(live_pids, dead_pid())
    path = state.write(tmp_path / "nvml.state")
    log_path = tmp_path / "exporter.log"
    with Exporter(
        args=["--collector.timeout=1"],
        env=state.env(path),
        state_dir=tmp_path / "s",
        log_path=log_path,
    ) as exp:
        assert value(exp.scrape(), "trainguard_collector_success", collector="gpu") == 1
        for symbol in ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2"):
            state.hang(symbol, 5)
        state.write(path)
        hung = exp.scrape()
        again = exp.scrape()
        waited = [
            value(s, "trainguard_collector_duration_seconds", collector="gpu") or 0.0
            for s in (hung, again)
        ]
        # the first scrape waited out the 1 s timeout; the next did not wait behind the stuck
        # call (queueing, it would wait that whole second again: this bounds a wait the
        # exporter makes, not the machine's speed)
        assert waited[0] >= 0.9 and waited[1] < 0.9, waited
        for s in (hung, again):
            assert value(s, "trainguard_collector_success", collector="gpu") == 0
            assert value(s, "trainguard_gpu_memory_used_bytes", gpu="0", uuid=g0_uuid()) is None
            assert value(s, "trainguard_collector_success", collector="runs") == 1
            assert value(s, "trainguard_collector_success", collector="checkpoints") == 1
        state.hangs.clear()
        state.write(path)
        back = poll(exp, lambda s: value(s, "trainguard_collector_success", collector="gpu") == 1)
        assert value(back, "trainguard_gpu_memory_used_bytes", gpu="0", uuid=g0_uuid()) == 10 * GIB
        log = exp.stop()
    assert log.count("collector gpu: did not finish within 1 s") == 1, log
    assert "collector gpu recovered" in log


def xids(s: dict[Any, float]) -> dict[tuple[str, str], float]:
    """{(gpu, xid): count} of trainguard_gpu_xid_errors_total."""
    return {
        (dict(lbl)["gpu"], dict(lbl)["xid"]): v
        for lbl, v in select(s, "trainguard_gpu_xid_errors_total").items()
    }


def test_xid_errors_are_counted_per_gpu_and_code(tmp_path: Path, live_pids: list[int]) -> None:
    """Critical Xid events (NVML's event API) counted per GPU and Xid code since the exporter
    started; a GPU whose driver offers no Xid events says so. The counts survive the GPU
    falling off the bus (Xid 79, then every query fails) and NVML failing to start again,
    and events are not counted twice when NVML is started afresh."""
    state = two_gpus(live_pids, dead_pid())
    state.gpus[1].xid_events = False  # e.g. WDDM: no Xid events
    path = state.write(tmp_path / "nvml.state")
    g0 = {"gpu": "0", "uuid": g0_uuid()}
    g1 = {"gpu": "1", "uuid": "GPU-bbbbbbbb-0000-0000-0000-000000000000"}
    with Exporter(env=state.env(path), state_dir=tmp_path / "s") as exp:
        s = exp.scrape()
        assert value(s, "trainguard_gpu_xid_events_supported", **g0) == 1
        assert value(s, "trainguard_gpu_xid_events_supported", **g1) == 0
        assert xids(s) == {}
        for code in (48, 13, 48):
            state.add_xid(0, code)
        state.add_xid(1, 31)  # not watched: the driver does not offer it
        state.write(path)
        s = poll(exp, lambda s: xids(s) == {("0", "48"): 2, ("0", "13"): 1}, 60)
        assert xids(s) == {("0", "48"): 2, ("0", "13"): 1}
        assert value(s, "trainguard_gpu_xid_errors_total", **g0, xid="48") == 2
        assert value(s, "trainguard_collector_success", collector="gpu") == 1

        # GPU 0 falls off the bus: Xid 79 arrives, then every query on it fails
        state.add_xid(0, 79)
        state.gpus[0].lost = True
        state.write(path)
        s = poll(exp, lambda s: ("0", "79") in xids(s), 60)
        assert xids(s) == {("0", "48"): 2, ("0", "13"): 1, ("0", "79"): 1}
        s = poll(exp, lambda s: value(s, "trainguard_collector_success", collector="gpu") == 0)
        assert value(s, "trainguard_gpu_memory_used_bytes", **g0) is None
        assert xids(s) == {("0", "48"): 2, ("0", "13"): 1, ("0", "79"): 1}

        # the driver is gone altogether: NVML cannot start, the counts are still published
        state.init_error = "driver_not_loaded"
        state.write(path)
        s = exp.scrape()
        assert value(s, "trainguard_collector_success", collector="gpu") == 0
        assert value(s, "trainguard_gpu_info", **g1, name="NVIDIA A100-SXM4-40GB") is None
        assert xids(s) == {("0", "48"): 2, ("0", "13"): 1, ("0", "79"): 1}

        # back (GPU reset, driver reloaded): NVML starts afresh, nothing counted twice
        state.init_error = None
        state.gpus[0].lost = False
        state.write(path)
        s = poll(exp, lambda s: value(s, "trainguard_collector_success", collector="gpu") == 1)
        assert value(s, "trainguard_collector_success", collector="gpu") == 1
        state.add_xid(0, 48)
        state.write(path)
        s = poll(exp, lambda s: xids(s).get(("0", "48")) == 3, 60)
        assert xids(s) == {("0", "48"): 3, ("0", "13"): 1, ("0", "79"): 1}
        log = exp.stop()
    assert "Traceback" not in log
    assert "GPU 0 (GPU-aaaaaaaa-0000-0000-0000-000000000000): Xid 79" in log


def test_wsl_memory_is_compared_per_device(tmp_path: Path, live_pids: list[int]) -> None:
    """Windows/WSL (WDDM): NVML lists a process without its memory, or no process at all, so
    nothing can be attributed per process. What the device-level comparison needs is there:
    each GPU's used memory, how many processes NVML lists on it, and each live run's allocator
    devices joined to their GPU by UUID, whatever CUDA_VISIBLE_DEVICES made of the index and
    whichever spelling each side uses."""
    a, b, _ = live_pids
    uuid0 = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
    uuid1 = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
    state = FakeNvmlState()
    state.add_gpu(uuid0, used=20 * GIB, total=24 * GIB)
    state.add_gpu(uuid1.upper(), used=11 * GIB, total=24 * GIB)
    state.add_process(0, a, None)  # WDDM: listed, memory not available
    path = state.write(tmp_path / "nvml.state")  # GPU 1: WSL lists no process at all
    heartbeats = tmp_path / "s"
    heartbeats.mkdir()
    stats = {"reserved_bytes.all.current": 10 * GIB, "allocated_bytes.all.peak": 9 * GIB}
    for run, pid, uuid in [
        ("wsl-a", a, "AAAAAAAA-1111-2222-3333-444444444444"),  # torch's spelling
        ("wsl-b", b, uuid1),  # CUDA_VISIBLE_DEVICES=1: its device 0 is GPU 1
        ("old-reporter", b, None),  # an older trainguard: no uuid
    ]:
        put(
            heartbeats,
            own_heartbeat(
                run,
                pid=pid,
                create_time=psutil.Process(pid).create_time(),
                allocator=(allocator_stats(0, stats, uuid),),
            ),
        )
    g0 = {"gpu": "0", "uuid": uuid0}
    g1 = {"gpu": "1", "uuid": uuid1}
    with Exporter(env=state.env(path), state_dir=heartbeats) as exp:
        s = exp.scrape()
    assert value(s, "trainguard_collector_success", collector="gpu") == 1
    assert value(s, "trainguard_collector_success", collector="runs") == 1
    # NVML's own uuid spelling is normalised too: both sides meet on one label value
    assert {dict(lbl)["uuid"] for lbl in select(s, "trainguard_gpu_info")} == {uuid0, uuid1}
    info = select(s, "trainguard_run_allocator_device_info")
    assert {(dict(lbl)["run"], dict(lbl)["device"], dict(lbl)["uuid"]) for lbl in info} == {
        ("wsl-a", "0", uuid0),
        ("wsl-b", "0", uuid1),
    }
    assert set(info.values()) == {1}
    # GPU 0: one process, memory unknown: nothing attributed, no driver view for the run
    assert value(s, "trainguard_gpu_processes", **g0) == 1
    assert value(s, "trainguard_gpu_processes_memory_unknown", **g0) == 1
    assert value(s, "trainguard_gpu_memory_unattributed_bytes", **g0) is None
    assert select(s, "trainguard_run_gpu_memory_used_bytes") == {}
    # GPU 1: NVML lists nobody, so "unattributed" is all of it: the rules must not read that
    # as ghost memory while a live run's allocator accounts for it
    assert value(s, "trainguard_gpu_processes", **g1) == 0
    assert value(s, "trainguard_gpu_memory_unattributed_bytes", **g1) == 11 * GIB
    assert value(s, "trainguard_gpu_memory_used_bytes", **g1) == 11 * GIB
    assert (
        value(s, "trainguard_run_allocator_reserved_bytes", run="wsl-b", rank="0", device="0")
        == 10 * GIB
    )


def test_a_failing_xid_wait_fails_the_collector_until_it_works(
    tmp_path: Path, live_pids: list[int]
) -> None:
    """The watcher's wait keeps failing (a driver in a bad state): that is not hidden, the
    collector fails at every scrape (the watcher is replaced each time) and the memory series
    are still published; once waits work again, so does the collector, and Xids count."""
    state = two_gpus(live_pids, dead_pid())
    state.fail("nvmlEventSetWait_v2", "unknown")
    path = state.write(tmp_path / "nvml.state")
    failing = lambda s: value(s, "trainguard_collector_success", collector="gpu") == 0  # noqa: E731
    with Exporter(env=state.env(path), state_dir=tmp_path / "s") as exp:
        poll(exp, failing, 60)
        for _ in range(3):
            s = exp.scrape()
            assert failing(s)
            assert value(s, "trainguard_gpu_memory_used_bytes", gpu="0", uuid=g0_uuid()) == 10 * GIB
        state.failures.clear()
        state.add_xid(0, 95)
        state.write(path)
        s = poll(exp, lambda s: not failing(s) and xids(s) == {("0", "95"): 1}, 60)
        assert not failing(s) and xids(s) == {("0", "95"): 1}
        log = exp.stop()
    assert "collector gpu: Xid events: waiting for Xid events failed: Unknown Error" in log


def _two_scrapes_series(
    before: dict[Any, float], after: dict[Any, float], minutes: tuple[int, int]
) -> list[dict[str, str]]:
    """promtool input series: ``before``'s samples for minutes[0] minutes, then ``after``'s for
    minutes[1] (a series absent from one scrape is absent then)."""
    target = {"job": "trainguard", "instance": "gpu-host:9636"}
    out = []
    for key in sorted(set(before) | set(after), key=lambda k: (k[0], sorted(k[1]))):
        name, labels = key
        if not name.startswith("trainguard_"):
            continue
        parts = []
        for samples, n in ((before, minutes[0]), (after, minutes[1])):
            v = samples.get(key)
            parts.append(f"_x{n}" if v is None else f"{v!r}x{n - 1}")
        inner = ",".join(f'{k}="{v}"' for k, v in sorted({**dict(labels), **target}.items()))
        out.append({"series": f"{name}{{{inner}}}", "values": " ".join(parts)})
    return out


def test_a_zombie_rank_holding_memory_pages_memory_not_released(tmp_path: Path) -> None:
    """A rank dies and stays <defunct> (its parent never reaps it) while the driver still lists
    it with 71 GiB: a zombie accounts for no memory, so the GPU's unattributed memory is the
    71 GiB, and GPUMemoryNotReleased fires on the shipped rules over the two real scrapes
    (trained for an hour, then the zombie)."""
    rank = sleeper()
    uuid = "GPU-cccccccc-0000-0000-0000-000000000000"
    state = FakeNvmlState(driver_version="550.54.15")
    state.add_gpu(uuid, used=71 * GIB + (300 << 20), total=80 * GIB)
    state.add_process(0, rank.pid, 71 * GIB)
    path = state.write(tmp_path / "nvml.state")
    heartbeats = tmp_path / "s"
    heartbeats.mkdir()
    put(
        heartbeats,
        own_heartbeat("llama-ft", pid=rank.pid, create_time=psutil.Process(rank.pid).create_time()),
    )
    g0 = {"gpu": "0", "uuid": uuid}
    try:
        with Exporter(env=state.env(path), state_dir=heartbeats) as exp:
            alive = exp.scrape()
            sigkill(rank.pid)  # not reaped: a zombie NVML still lists
            assert psutil.Process(rank.pid).status() == psutil.STATUS_ZOMBIE
            dead = poll(
                exp,
                lambda s: value(s, "trainguard_run_process_up", run="llama-ft", rank="0") == 0,
            )
    finally:
        rank.kill()
        rank.wait()
    assert value(alive, "trainguard_gpu_memory_unattributed_bytes", **g0) == 300 << 20
    assert select(alive, "trainguard_gpu_process_memory_used_bytes", run="llama-ft")
    assert value(dead, "trainguard_gpu_processes", **g0) == 1
    # the zombie's 71 GiB is no live process's
    assert value(dead, "trainguard_gpu_memory_unattributed_bytes", **g0) == 71 * GIB + (300 << 20)
    assert value(dead, "trainguard_gpu_memory_uninterruptible_bytes", **g0) == 0
    fired = firing(
        _two_scrapes_series(alive, dead, (60, 30)),
        [("GPUMemoryNotReleased", 75)],
        tmp_path,
    )
    alerts = fired[("GPUMemoryNotReleased", 75)]
    assert [a[0]["uuid"] for a in alerts] == [uuid], fired
    assert "llama-ft" in alerts[0][1]["description"]
