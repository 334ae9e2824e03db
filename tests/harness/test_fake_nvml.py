"""The fake libnvidia-ml.so.1, driven through the real pynvml in child processes.

LD_LIBRARY_PATH only takes effect at process start, so every check runs
``sys.executable -c CODE`` with the fake library's environment; the child
prints one JSON line per step.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import nvml_fake
from helpers.nvml_fake import (
    LIB_NAME,
    SOURCE_DIR,
    FakeNvmlState,
    build_fake_nvml,
    fake_nvml_env,
)
from helpers.wait import wait_for

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the fake NVML is a Linux shared library"
)

NA32 = 0xFFFF_FFFF
GIB = 1 << 30

PRELUDE = """\
import json, sys
import pynvml as n

def out(value):
    print(json.dumps(value), flush=True)

def err(fn, *args):
    try:
        fn(*args)
    except n.NVMLError as e:
        return type(e).__name__
    return "no error"

def procs(items):
    return [[p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId] for p in items]
"""


@pytest.fixture(scope="module")
def lib_dir() -> Path:
    if shutil.which(os.environ.get("CC", "gcc")) is None:
        pytest.fail("gcc is needed to build the fake NVML library (tests/fakenvml/build.sh)")
    return build_fake_nvml()


@pytest.fixture
def state_path(tmp_path: Path) -> Path:
    return tmp_path / "nvml.state"


def run_child(code: str, env: dict[str, str], timeout: float = 120) -> list[Any]:
    """Run PRELUDE + code in a child Python; return its JSON output lines."""
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, f"child failed:\n{proc.stdout}\n{proc.stderr}"
    return [json.loads(line) for line in proc.stdout.splitlines()]


class Child:
    """A child Python that runs step by step: it prints a JSON line, then
    waits for a line on stdin before going on, so the test can rewrite the
    state file while the child keeps NVML initialised."""

    def __init__(self, code: str, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PRELUDE + "def wait():\n    sys.stdin.readline()\n" + code],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def recv(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=60)
            stderr = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"child exited {self.proc.returncode}:\n{stderr}")
        return json.loads(line)

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=60)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def two_gpus() -> FakeNvmlState:
    state = FakeNvmlState(driver_version="550.54.15")
    state.add_gpu(
        "GPU-11111111-2222-3333-4444-555555555555",
        name="NVIDIA H100 80GB HBM3",
        total=80 * GIB,
        used=3 * GIB,
        reserved=GIB // 2,
    )
    state.add_gpu(
        "GPU-66666666-7777-8888-9999-000000000000",
        name="NVIDIA GeForce RTX 4090",
        total=24 * GIB,
        used=GIB,
    )
    return state


def test_two_gpus_identity_and_memory(lib_dir: Path, state_path: Path) -> None:
    state = two_gpus()
    state.write(state_path)
    [result] = run_child(
        """
        n.nvmlInit()
        gpus = []
        for i in range(n.nvmlDeviceGetCount()):
            h = n.nvmlDeviceGetHandleByIndex(i)
            m1 = n.nvmlDeviceGetMemoryInfo(h)
            m2 = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
            by_uuid = n.nvmlDeviceGetHandleByUUID(n.nvmlDeviceGetUUID(h))
            gpus.append({
                "index": n.nvmlDeviceGetIndex(h),
                "name": n.nvmlDeviceGetName(h),
                "uuid": n.nvmlDeviceGetUUID(h),
                "v1": [m1.total, m1.free, m1.used],
                "v2": [m2.total, m2.reserved, m2.free, m2.used],
                "by_uuid_index": n.nvmlDeviceGetIndex(by_uuid),
                "temp": n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
                "util": n.nvmlDeviceGetUtilizationRates(h).gpu,
            })
        out({
            "driver": n.nvmlSystemGetDriverVersion(),
            "nvml": n.nvmlSystemGetNVMLVersion(),
            "cuda": n.nvmlSystemGetCudaDriverVersion(),
            "gpus": gpus,
            "unknown_uuid": err(n.nvmlDeviceGetHandleByUUID, "GPU-nope"),
            "bad_index": err(n.nvmlDeviceGetHandleByIndex, 2),
        })
        n.nvmlShutdown()
        """,
        state.env(state_path),
    )
    assert result["driver"] == "550.54.15"
    assert result["nvml"] == "12.550.54.15"
    assert result["cuda"] == 12040
    assert result["unknown_uuid"] == "NVMLError_NotFound"
    assert result["bad_index"] == "NVMLError_InvalidArgument"
    g0, g1 = result["gpus"]
    assert (g0["index"], g0["name"], g0["uuid"]) == (
        0,
        "NVIDIA H100 80GB HBM3",
        "GPU-11111111-2222-3333-4444-555555555555",
    )
    assert (g1["index"], g1["name"], g1["uuid"]) == (
        1,
        "NVIDIA GeForce RTX 4090",
        "GPU-66666666-7777-8888-9999-000000000000",
    )
    # v1: used includes the reserved part; v2 splits it out.
    assert g0["v1"] == [80 * GIB, 77 * GIB, 3 * GIB]
    assert g0["v2"] == [80 * GIB, GIB // 2, 77 * GIB, 3 * GIB - GIB // 2]
    assert g1["v1"] == [24 * GIB, 23 * GIB, GIB]
    assert g1["v2"] == [24 * GIB, 0, 23 * GIB, GIB]
    assert [g["by_uuid_index"] for g in result["gpus"]] == [0, 1]
    assert [g["temp"] for g in result["gpus"]] == [40, 40]
    assert [g["util"] for g in result["gpus"]] == [0, 0]


def test_processes_compute_graphics_and_not_available(lib_dir: Path, state_path: Path) -> None:
    state = two_gpus()
    state.add_process(0, pid=1234, used=GIB)
    state.add_process(0, pid=1235, used=512 << 20, gpu_instance_id=1, compute_instance_id=0)
    state.add_process(0, pid=1240, used=None, kind="graphics")  # WDDM / WSL
    state.add_process(1, pid=2000, used=3 << 20, kind="graphics")
    state.add_process(1, pid=2001, used=7 << 20)
    state.write(state_path)
    [result] = run_child(
        """
        n.nvmlInit()
        hs = [n.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
        out({
            "compute": [procs(n.nvmlDeviceGetComputeRunningProcesses(h)) for h in hs],
            "graphics": [procs(n.nvmlDeviceGetGraphicsRunningProcesses(h)) for h in hs],
            "mps": [procs(n.nvmlDeviceGetMPSComputeRunningProcesses(h)) for h in hs],
        })
        """,
        state.env(state_path),
    )
    assert result["compute"] == [
        [[1234, GIB, NA32, NA32], [1235, 512 << 20, 1, 0]],
        [[2001, 7 << 20, NA32, NA32]],
    ]
    # pynvml turns NVML_VALUE_NOT_AVAILABLE into None.
    assert result["graphics"] == [[[1240, None, NA32, NA32]], [[2000, 3 << 20, NA32, NA32]]]
    assert result["mps"] == [[], []]


def test_thousand_processes_on_one_gpu(lib_dir: Path, state_path: Path) -> None:
    state = two_gpus()
    for pid in range(10_000, 11_000):
        state.add_process(0, pid=pid, used=pid)
    state.write(state_path)
    [result] = run_child(
        """
        n.nvmlInit()
        h0, h1 = n.nvmlDeviceGetHandleByIndex(0), n.nvmlDeviceGetHandleByIndex(1)
        out([procs(n.nvmlDeviceGetComputeRunningProcesses(h)) for h in (h0, h1)])
        """,
        state.env(state_path),
    )
    assert result == [[[pid, pid, NA32, NA32] for pid in range(10_000, 11_000)], []]


def test_128_gpus_and_2048_processes(lib_dir: Path, state_path: Path) -> None:
    state = FakeNvmlState()
    for _ in range(128):
        state.add_gpu()
    for pid in range(1, 2049):
        state.add_process(127, pid=pid, used=None if pid % 2 else pid, kind="graphics")
    state.write(state_path)
    [result] = run_child(
        """
        n.nvmlInit()
        count = n.nvmlDeviceGetCount()
        last = n.nvmlDeviceGetHandleByIndex(count - 1)
        plist = procs(n.nvmlDeviceGetGraphicsRunningProcesses(last))
        out([count, n.nvmlDeviceGetUUID(last), plist])
        """,
        state.env(state_path),
    )
    count, uuid, plist = result
    assert count == 128
    assert uuid == "GPU-0000007f-0000-4000-8000-00000000007f"
    assert [p[0] for p in plist] == list(range(1, 2049))
    assert [p[1] for p in plist] == [None if pid % 2 else pid for pid in range(1, 2049)]


def test_insufficient_size_protocol_in_c(lib_dir: Path, state_path: Path) -> None:
    """What pynvml does not exercise: a too-small non-zero count, NULL with room."""
    state = two_gpus()
    for pid in range(100, 105):
        state.add_process(0, pid=pid, used=pid)
    state.write(state_path)
    [result] = run_child(
        """
        import ctypes
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        count = ctypes.c_uint(0)
        before_init = lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
        assert lib.nvmlInitWithFlags(0) == 0
        dev = ctypes.c_void_p()
        assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0
        fn = lib.nvmlDeviceGetComputeRunningProcesses_v3
        rows = (n.c_nvmlProcessInfo_t * 8)()
        steps = []
        for start, buf in [(0, None), (2, rows), (5, None), (5, rows), (8, rows)]:
            count = ctypes.c_uint(start)
            rc = fn(dev, ctypes.byref(count), buf)
            steps.append([start, buf is not None, rc, count.value])
        v1 = (ctypes.c_ulonglong * 2 * 5)()  # nvmlProcessInfo_v1_t: pid (padded), used
        count = ctypes.c_uint(5)
        rc_v1 = lib.nvmlDeviceGetComputeRunningProcesses(dev, ctypes.byref(count), v1)
        empty = ctypes.c_void_p()
        lib.nvmlDeviceGetHandleByIndex_v2(1, ctypes.byref(empty))
        count = ctypes.c_uint(0)
        rc_empty = fn(empty, ctypes.byref(count), None)
        out({
            "before_init": before_init,
            "steps": steps,
            "pids": [rows[i].pid for i in range(5)],
            "v1": [rc_v1, [v1[i][1] for i in range(5)]],
            "empty": [rc_empty, count.value],
            "bad_handle": lib.nvmlDeviceGetName(ctypes.c_void_p(8), rows, 8),
            "null_count": fn(dev, None, rows),
            "mem_v2_bad_version": lib.nvmlDeviceGetMemoryInfo_v2(dev, (ctypes.c_char * 40)()),
        })
        """,
        state.env(state_path),
    )
    uninitialized, insufficient, invalid, success = 1, 7, 2, 0
    assert result["before_init"] == uninitialized
    assert result["steps"] == [
        [0, False, insufficient, 5],
        [2, True, insufficient, 5],
        [5, False, invalid, 5],
        [5, True, success, 5],
        [8, True, success, 5],
    ]
    assert result["pids"] == [100, 101, 102, 103, 104]
    assert result["v1"] == [success, [100, 101, 102, 103, 104]]
    assert result["empty"] == [success, 0]
    assert result["bad_handle"] == invalid
    assert result["null_count"] == invalid
    assert result["mem_v2_bad_version"] == 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH


def test_lost_gpu_then_recovered_in_the_same_process(lib_dir: Path, state_path: Path) -> None:
    state = two_gpus()
    state.add_process(0, pid=1234, used=GIB)
    state.write(state_path)
    child = Child(
        """
n.nvmlInit()
hs = [n.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
def look():
    return {
        "mem": [err(n.nvmlDeviceGetMemoryInfo, h) for h in hs],
        "used0": err(lambda: out_used(hs[0])),
        "procs": [err(n.nvmlDeviceGetComputeRunningProcesses, h) for h in hs],
        "name": [err(n.nvmlDeviceGetName, h) for h in hs],
        "handle": [err(n.nvmlDeviceGetHandleByIndex, i) for i in range(2)],
        "count": n.nvmlDeviceGetCount(),
    }
used = []
def out_used(h):
    used.append(n.nvmlDeviceGetMemoryInfo(h).used)
out(look()); wait()
out(look()); wait()
out([look(), used])
n.nvmlShutdown()
""",
        state.env(state_path),
    )
    try:
        ok = "no error"
        first = child.recv()
        assert first["mem"] == [ok, ok]
        assert first["procs"] == [ok, ok]

        state.gpus[0].lost = True
        state.write(state_path)
        child.go()
        lost = child.recv()
        gone = "NVMLError_GpuIsLost"  # pynvml capwords: not GPUIsLost
        assert lost["mem"] == [gone, ok]
        assert lost["used0"] == gone
        assert lost["procs"] == [gone, ok]
        assert lost["name"] == [gone, ok]
        assert lost["handle"] == [gone, ok]
        assert lost["count"] == 2

        state.gpus[0].lost = False
        state.gpus[0].used = 5 * GIB
        state.write(state_path)
        child.go()
        back, used = child.recv()
        assert back["mem"] == [ok, ok]
        assert back["procs"] == [ok, ok]
        assert back["handle"] == [ok, ok]
        assert used == [3 * GIB, 5 * GIB]
        assert child.proc.wait(timeout=60) == 0
    finally:
        child.close()


@pytest.mark.parametrize(
    ("init", "expected"),
    [
        ("driver_not_loaded", "NVMLError_DriverNotLoaded"),
        ("lib_rm_version_mismatch", "NVMLError_LibRmVersionMismatch"),
        ("unknown", "NVMLError_Unknown"),
    ],
)
def test_init_failure(lib_dir: Path, state_path: Path, init: str, expected: str) -> None:
    state = two_gpus()
    state.init_error = init
    state.write(state_path)
    [result] = run_child("out([err(n.nvmlInit), err(n.nvmlDeviceGetCount)])", state.env(state_path))
    assert result == [expected, "NVMLError_Uninitialized"]


def test_missing_state_file_is_driver_not_loaded(lib_dir: Path, tmp_path: Path) -> None:
    env = fake_nvml_env(tmp_path / "absent.state", lib_dir=lib_dir)
    [result] = run_child("out(err(n.nvmlInit))", env)
    assert result == "NVMLError_DriverNotLoaded"
    del env["TRAINGUARD_FAKE_NVML_STATE"]
    [result] = run_child("out(err(n.nvmlInit))", env)
    assert result == "NVMLError_DriverNotLoaded"


def test_state_file_vanishing_after_init_is_unknown(lib_dir: Path, state_path: Path) -> None:
    state = two_gpus()
    state.write(state_path)
    [result] = run_child(
        f"""
        import os
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        os.unlink({str(state_path)!r})
        out([err(n.nvmlDeviceGetCount), err(n.nvmlDeviceGetMemoryInfo, h)])
        """,
        state.env(state_path),
    )
    assert result == ["NVMLError_Unknown", "NVMLError_Unknown"]


def test_malformed_state_is_rejected_loudly(lib_dir: Path, state_path: Path) -> None:
    state_path.write_text("driver 550.54.15\ngpu 0 uuid=GPU-x colour=red\n")
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + "out(err(n.nvmlInit))"],
        env=fake_nvml_env(state_path, lib_dir=lib_dir),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(proc.stdout) == "NVMLError_Unknown"
    assert f"{state_path}:2: bad gpu attribute 'colour=red'" in proc.stderr


def test_init_is_reference_counted(lib_dir: Path, state_path: Path) -> None:
    state = two_gpus()
    state.write(state_path)
    [result] = run_child(
        """
        n.nvmlInit(); n.nvmlInit()
        n.nvmlShutdown()
        after_one = n.nvmlDeviceGetCount()
        n.nvmlShutdown()
        out([after_one, err(n.nvmlDeviceGetCount), err(n.nvmlShutdown)])
        """,
        state.env(state_path),
    )
    assert result == [2, "NVMLError_Uninitialized", "NVMLError_Uninitialized"]


def test_injected_failure_on_one_gpu(lib_dir: Path, state_path: Path) -> None:
    state = two_gpus()
    state.add_process(1, pid=7, used=1)
    state.fail("nvmlDeviceGetComputeRunningProcesses_v3", "not_supported", gpu=0)
    state.gpus[1].error = "unknown"
    state.add_gpu(error="no_permission")
    state.write(state_path)
    [result] = run_child(
        """
        n.nvmlInit()
        h0 = n.nvmlDeviceGetHandleByIndex(0)
        out([
            err(n.nvmlDeviceGetComputeRunningProcesses, h0),
            err(n.nvmlDeviceGetGraphicsRunningProcesses, h0),
            err(n.nvmlDeviceGetHandleByIndex, 1),
            err(n.nvmlDeviceGetHandleByIndex, 2),
        ])
        """,
        state.env(state_path),
    )
    assert result == [
        "NVMLError_NotSupported",
        "no error",
        "NVMLError_Unknown",
        "NVMLError_NoPermission",
    ]


def test_call_log(lib_dir: Path, state_path: Path, tmp_path: Path) -> None:
    state = two_gpus()
    state.write(state_path)
    log = tmp_path / "calls.log"
    run_child(
        "n.nvmlInit(); n.nvmlDeviceGetCount(); n.nvmlShutdown(); err(n.nvmlShutdown)",
        state.env(state_path, log_path=log),
    )
    assert log.read_text().splitlines() == [
        "nvmlInitWithFlags 0",
        "nvmlDeviceGetCount_v2 0",
        "nvmlShutdown 0",
        "nvmlShutdown 1",
    ]


def test_threads_while_the_state_is_rewritten(lib_dir: Path, state_path: Path) -> None:
    """Eight threads query while the state file flips between two shapes; every
    answer must be wholly one shape or the other."""
    small, big = two_gpus(), two_gpus()
    small.gpus[0].used = GIB
    for pid in range(3):
        small.add_process(0, pid=100 + pid, used=GIB)
    big.gpus[0].used = 2 * GIB
    for pid in range(6):
        big.add_process(0, pid=200 + pid, used=GIB)
    small.write(state_path)
    child = Child(
        """
import threading
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
seen, errors, stop = set(), [], threading.Event()
def hammer():
    while not stop.is_set():
        try:
            seen.add(tuple(p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)))
            seen.add(n.nvmlDeviceGetMemoryInfo(h).used)
        except Exception as e:
            errors.append(repr(e))
threads = [threading.Thread(target=hammer) for _ in range(8)]
for t in threads: t.start()
out("started"); wait()
stop.set()
for t in threads: t.join()
out([sorted(map(str, seen)), errors[:5]])
""",
        small.env(state_path),
    )
    try:
        assert child.recv() == "started"
        for i in range(200):
            (big if i % 2 == 0 else small).write(state_path)
        child.go()
        seen, errors = child.recv()
    finally:
        child.close()
    assert errors == []
    allowed = {
        str(GIB),
        str(2 * GIB),
        str((100, 101, 102)),
        str((200, 201, 202, 203, 204, 205)),
    }
    assert set(seen) <= allowed
    assert str((100, 101, 102)) in seen


def test_rewrites_in_place_are_seen_at_once(lib_dir: Path, state_path: Path) -> None:
    """The library re-parses only when the file changed (a stat per call); a rewrite that keeps
    the inode and the size, right after the last read and so within the file timestamps' coarse
    tick, must still be seen at the next call, and so must one after the parse was cached."""
    a, b = two_gpus(), two_gpus()
    a.gpus[0].used = 1 * GIB
    b.gpus[0].used = 2 * GIB  # 1073741824 and 2147483648: the same number of digits
    text_a, text_b = a.render().encode(), b.render().encode()
    assert len(text_a) == len(text_b)
    a.write(state_path)
    child = Child(
        """
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
while True:
    out(n.nvmlDeviceGetMemoryInfo(h).used); wait()
""",
        a.env(state_path),
    )

    def rewrite_in_place(text: bytes) -> None:
        fd = os.open(state_path, os.O_WRONLY)  # no O_TRUNC: same inode, same size
        try:
            os.write(fd, text)
        finally:
            os.close(fd)

    try:
        assert child.recv() == GIB
        ino = state_path.stat().st_ino
        for i in range(60):
            text, used = (text_b, 2 * GIB) if i % 2 == 0 else (text_a, GIB)
            rewrite_in_place(text)
            child.go()
            assert child.recv() == used, f"rewrite {i} not seen"
        # Once the file is older than the library's racy window, the parse is cached;
        # a rewrite after that is seen too.
        wait_for(
            lambda: time.time() - state_path.stat().st_ctime > 0.5,
            what="the state file to be older than the library's racy window",
        )
        for _ in range(3):  # the first parses and caches, the others are cache hits
            child.go()
            assert child.recv() == GIB
        rewrite_in_place(text_b)
        child.go()
        assert child.recv() == 2 * GIB
        assert state_path.stat().st_ino == ino
    finally:
        child.close()


def test_xid_events_arrive_once_on_the_gpus_a_set_watches(lib_dir: Path, state_path: Path) -> None:
    """The event API as pynvml drives it: supported types per GPU, registration refused where
    Xid events are not offered, a zero-timeout wait that says TIMEOUT when nothing is pending,
    each injected event delivered once (file rewrites do not repeat it), in file order."""
    state = two_gpus()
    state.gpus[1].xid_events = False
    state.write(state_path)
    child = Child(
        """
n.nvmlInit()
h0, h1 = n.nvmlDeviceGetHandleByIndex(0), n.nvmlDeviceGetHandleByIndex(1)
X = n.nvmlEventTypeXidCriticalError
s = n.nvmlEventSetCreate()
n.nvmlDeviceRegisterEvents(h0, X, s)
def drain():
    got = []
    while True:
        try:
            d = n.nvmlEventSetWait_v2(s, 0)
        except n.NVMLError_Timeout:
            return got
        got.append([n.nvmlDeviceGetIndex(d.device), d.eventType, d.eventData,
                    d.gpuInstanceId, d.computeInstanceId])
out([
    bool(n.nvmlDeviceGetSupportedEventTypes(h0) & X),
    bool(n.nvmlDeviceGetSupportedEventTypes(h1) & X),
    err(n.nvmlDeviceRegisterEvents, h1, X, s),
    drain(),
]); wait()
out(drain()); wait()
out(drain())
n.nvmlEventSetFree(s)
out(err(n.nvmlEventSetWait_v2, s, 0))
""",
        state.env(state_path),
    )
    try:
        assert child.recv() == [True, False, "NVMLError_NotSupported", []]
        state.add_xid(0, 79)
        state.add_xid(1, 13)  # GPU 1 is not watched: never delivered
        state.add_xid(0, 48)
        state.write(state_path)
        child.go()
        x = 0x8
        assert child.recv() == [[0, x, 79, NA32, NA32], [0, x, 48, NA32, NA32]]
        state.write(state_path)  # the same events again: already delivered
        child.go()
        assert child.recv() == []
        assert child.recv() == "NVMLError_InvalidArgument"
    finally:
        child.close()


def test_a_waiting_set_gets_an_event_written_meanwhile(lib_dir: Path, state_path: Path) -> None:
    state = two_gpus()
    state.write(state_path)
    child = Child(
        """
n.nvmlInit()
s = n.nvmlEventSetCreate()
n.nvmlDeviceRegisterEvents(n.nvmlDeviceGetHandleByIndex(1), n.nvmlEventTypeXidCriticalError, s)
out(err(n.nvmlEventSetWait_v2, s, 1))
out("waiting")
d = n.nvmlEventSetWait_v2(s, 120_000)
out([n.nvmlDeviceGetIndex(d.device), d.eventData])
""",
        state.env(state_path),
    )
    try:
        assert child.recv() == "NVMLError_Timeout"
        assert child.recv() == "waiting"
        state.add_xid(1, 94)
        state.write(state_path)
        assert child.recv() == [1, 94]
    finally:
        child.close()


def test_xid_lines_are_checked(lib_dir: Path, state_path: Path) -> None:
    for bad, message in [
        ("xid 0 79", "xid GPU CODE id=N"),
        ("xid 5 79 id=1", "names gpu 5, which is not listed"),
        ("xid 0 79 id=1\nxid 0 48 id=1", "id=1 listed twice"),
    ]:
        state_path.write_text(f"gpu 0\n{bad}\n")
        proc = subprocess.run(
            [sys.executable, "-c", PRELUDE + "out(err(n.nvmlInit))"],
            env=fake_nvml_env(state_path, lib_dir=lib_dir),
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        assert json.loads(proc.stdout) == "NVMLError_Unknown", bad
        assert message in proc.stderr, (bad, proc.stderr)


HEALTH_CHILD = """
n.nvmlInit()
def health(i):
    h = n.nvmlDeviceGetHandleByIndex(i)
    def call(fn, *args):
        try:
            return fn(h, *args)
        except n.NVMLError as e:
            return type(e).__name__
    util = call(n.nvmlDeviceGetUtilizationRates)
    return {
        "reasons": call(n.nvmlDeviceGetCurrentClocksEventReasons),
        "throttle": call(n.nvmlDeviceGetCurrentClocksThrottleReasons),
        "pcie": [call(f) for f in (
            n.nvmlDeviceGetCurrPcieLinkGeneration, n.nvmlDeviceGetMaxPcieLinkGeneration,
            n.nvmlDeviceGetGpuMaxPcieLinkGeneration, n.nvmlDeviceGetCurrPcieLinkWidth,
            n.nvmlDeviceGetMaxPcieLinkWidth)],
        "util": util if isinstance(util, str) else [util.gpu, util.memory],
        "power": [call(n.nvmlDeviceGetPowerUsage), call(n.nvmlDeviceGetEnforcedPowerLimit)],
        "temp": [call(n.nvmlDeviceGetTemperature, n.NVML_TEMPERATURE_GPU),
                 call(n.nvmlDeviceGetTemperatureThreshold, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
                 call(n.nvmlDeviceGetTemperatureThreshold, n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
                 call(n.nvmlDeviceGetTemperatureThreshold, n.NVML_TEMPERATURE_THRESHOLD_MEM_MAX),
                 call(n.nvmlDeviceGetTemperatureThreshold, 99)],
        "ecc": [call(n.nvmlDeviceGetTotalEccErrors, t, c)
                for t in (n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
                for c in (n.NVML_VOLATILE_ECC, n.NVML_AGGREGATE_ECC)]
               + [call(n.nvmlDeviceGetTotalEccErrors, *bad) for bad in ((2, 0), (0, 2))],
        "remap": call(n.nvmlDeviceGetRemappedRows),
    }
out([health(i) for i in range(n.nvmlDeviceGetCount())])
"""


def test_health_calls_with_nvml_semantics(lib_dir: Path, state_path: Path) -> None:
    """Clock event reasons (one bit mask under the new and the old name), PCIe link (current,
    device+system max, GPU max), utilisation, power (mW), temperature and its thresholds, ECC
    totals per error and counter type, remapped rows; NOT_SUPPORTED per device and symbol."""
    state = two_gpus()
    busy = state.gpus[0]
    busy.utilization, busy.memory_utilization = 100, 40
    busy.clock_event_reasons = 0x4 | 0x40  # SW power cap + HW thermal slowdown
    busy.pcie_generation, busy.pcie_max_generation, busy.pcie_gpu_max_generation = 2, 4, 5
    busy.pcie_width, busy.pcie_max_width = 8, 16
    busy.power_mw, busy.power_limit_mw = 412_345, 700_000
    busy.ecc_corrected, busy.ecc_uncorrected = 7, 1
    busy.ecc_corrected_aggregate = 30
    busy.remapped_corrected, busy.remapped_uncorrected = 2, 1
    busy.remap_pending = True
    busy.temperature = 83
    # GPU 1: a GeForce: no ECC, no row remapping, no power limit reading
    for symbol in (
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetEnforcedPowerLimit",
    ):
        state.fail(symbol, "not_supported", gpu=1)
    state.write(state_path)
    g0, g1 = run_child(HEALTH_CHILD, state.env(state_path))[0]
    assert g0 == {
        "reasons": 0x44,
        "throttle": 0x44,
        "pcie": [2, 4, 5, 8, 16],
        "util": [100, 40],
        "power": [412_345, 700_000],
        "temp": [83, 87, 92, "NVMLError_NotSupported", "NVMLError_InvalidArgument"],
        # corrected volatile, corrected aggregate, uncorrected volatile, uncorrected aggregate
        "ecc": [7, 30, 1, 1, "NVMLError_InvalidArgument", "NVMLError_InvalidArgument"],
        "remap": [2, 1, 1, 0],
    }
    assert g1["reasons"] == g1["throttle"] == 0x1  # idle: GpuIdle, NVML's own default at rest
    assert g1["pcie"] == [5, 5, 5, 16, 16]
    assert g1["power"] == [70_000, "NVMLError_NotSupported"]
    assert g1["ecc"] == ["NVMLError_NotSupported"] * 6
    assert g1["remap"] == "NVMLError_NotSupported"
    # the bit values are nvml.h's, as the real pynvml names them
    [names] = run_child(
        "out({k: getattr(n, k) for k in dir(n) if k.startswith('nvmlClocksEventReason')})",
        state.env(state_path),
    )
    ours = {k: v for k, v in vars(nvml_fake).items() if k.startswith("REASON_")}
    assert len(ours) == 9
    for name, bit in ours.items():
        camel = "".join(w.capitalize() for w in name.removeprefix("REASON_").split("_"))
        assert names["nvmlClocksEventReason" + camel] == bit, name


RETIREMENT_NVLINK_CHILD = """
n.nvmlInit()
def read(i):
    h = n.nvmlDeviceGetHandleByIndex(i)
    def call(fn, *args):
        try:
            return fn(h, *args)
        except n.NVMLError as e:
            return type(e).__name__
    fn = n._nvmlGetFunctionPointer("nvmlDeviceGetRetiredPages")
    count = n.c_uint(0)
    first = fn(h, 1, n.byref(count), None)  # the size alone: INSUFFICIENT_SIZE and the count
    return {
        "pages": [call(n.nvmlDeviceGetRetiredPages, c) for c in (0, 1, 2)],
        "size_query": [first, count.value],
        "pending": call(n.nvmlDeviceGetRetiredPagesPendingStatus),
        "remap": call(n.nvmlDeviceGetRemappedRows),
        "state": [call(n.nvmlDeviceGetNvLinkState, link) for link in (0, 1, 2, 3, 36)],
        "errors": [call(n.nvmlDeviceGetNvLinkErrorCounter, link, c)
                   for link in (0, 2) for c in range(6)],
    }
out([read(i) for i in range(n.nvmlDeviceGetCount())])
"""


def test_retired_pages_and_nvlink_with_nvml_semantics(lib_dir: Path, state_path: Path) -> None:
    """A GPU before Ampere retires pages (by cause, pending; the count-only first call answers
    INSUFFICIENT_SIZE with the count) and has no remapped rows; an H100 the reverse. NVLink:
    state per link (inactive links 0, NOT_SUPPORTED past the GPU's links or on a GPU without
    NVLink, INVALID_ARGUMENT past NVML_NVLINK_MAX_LINKS), error counters per link and kind
    (ECC data NOT_SUPPORTED, as before Ampere; past it INVALID_ARGUMENT); NOT_SUPPORTED settable
    per GPU with a fail line."""
    state = two_gpus()
    volta = state.gpus[0]
    volta.page_retirement, volta.retired_sbe, volta.retired_dbe = True, 2, 1
    volta.retired_pending = True
    volta.nvlinks, volta.nvlink_down = 3, 0x2
    volta.nvlink_errors = {(0, "replay"): 5, (0, "crc_data"): 2, (2, "recovery"): 1}
    state.fail("nvmlDeviceGetNvLinkErrorCounter", "not_supported", gpu=1)
    state.gpus[1].nvlinks = 1
    state.write(state_path)
    g0, g1 = run_child(RETIREMENT_NVLINK_CHILD, state.env(state_path))[0]
    nope, bad = "NVMLError_NotSupported", "NVMLError_InvalidArgument"
    assert g0 == {
        "pages": [[0x100000, 0x101000], [0x200000], bad],
        "size_query": [7, 1],
        "pending": 1,
        "remap": nope,
        "state": [1, 0, 1, nope, bad],
        "errors": [5, 0, 0, 2, nope, bad, 0, 1, 0, 0, nope, bad],
    }
    assert g1["pages"] == [nope, nope, nope] and g1["pending"] == nope
    assert g1["remap"] == [0, 0, 0, 0]
    assert g1["state"] == [1, nope, nope, nope, bad]
    assert g1["errors"] == [nope] * 6 + [nope] * 6


def test_health_attributes_are_checked(lib_dir: Path, state_path: Path) -> None:
    for bad, message in [
        ("gpu 0 pcie_gen=5 pcie_max_gen=4", "pcie_gen <= pcie_max_gen"),
        ("gpu 0 pcie_max_gen=5 pcie_gpu_max_gen=4", "pcie_max_gen <= pcie_gpu_max_gen"),
        ("gpu 0 pcie_gen=0", "1 <= pcie_gen"),
        ("gpu 0 pcie_width=32", "pcie_width <= pcie_max_width"),
        ("gpu 0 ecc_corrected=5 ecc_corrected_aggregate=4", "aggregate ECC counts"),
        ("gpu 0 remap_pending=2", "bad gpu attribute 'remap_pending=2'"),
        ("gpu 0 power=-1", "bad gpu attribute 'power=-1'"),
        ("gpu 0 nvlinks=19", "bad gpu attribute 'nvlinks=19'"),
        ("gpu 0 nvlink18_replay=1", "bad gpu attribute 'nvlink18_replay=1'"),
        ("gpu 0 nvlink0_bogus=1", "bad gpu attribute 'nvlink0_bogus=1'"),
        ("gpu 0 retired_pending=2", "bad gpu attribute 'retired_pending=2'"),
    ]:
        state_path.write_text(f"{bad}\n")
        proc = subprocess.run(
            [sys.executable, "-c", PRELUDE + "out(err(n.nvmlInit))"],
            env=fake_nvml_env(state_path, lib_dir=lib_dir),
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        assert json.loads(proc.stdout) == "NVMLError_Unknown", bad
        assert message in proc.stderr, (bad, proc.stderr)


def test_build_is_idempotent(lib_dir: Path) -> None:
    lib = lib_dir / LIB_NAME
    before = lib.stat().st_mtime_ns
    out = subprocess.run(
        [str(SOURCE_DIR / "build.sh")], capture_output=True, text=True, check=True, cwd="/"
    ).stdout
    assert Path(out.strip()) == lib_dir
    assert lib.stat().st_mtime_ns == before
    assert os.readlink(lib_dir / "libnvidia-ml.so") == LIB_NAME
    assert build_fake_nvml() == lib_dir
