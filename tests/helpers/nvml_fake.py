"""Test helper: a fake ``libnvidia-ml.so.1`` that the real ``pynvml`` loads.

``tests/fakenvml/fakenvml.c`` is compiled into ``build/fakenvml/`` and reads
the GPUs and processes it reports from a state file (format in
``tests/fakenvml/README.md``). This module builds the library, writes state
files atomically and gives the environment a child process needs.

pynvml loads the library with ``CDLL("libnvidia-ml.so.1")``; the dynamic loader
reads ``LD_LIBRARY_PATH`` only when a process starts, so the code under test
must run in a child process started with :func:`fake_nvml_env`'s environment.

Example::

    state = FakeNvmlState()
    gpu = state.add_gpu(name="NVIDIA H100 80GB HBM3", used=2 << 30)
    state.add_process(0, pid=1234, used=1 << 30)
    state.write(tmp_path / "nvml.state")
    subprocess.run([...], env=state.env(tmp_path / "nvml.state"))
    gpu.lost = True
    state.write(tmp_path / "nvml.state")  # the running child sees it at its next query
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from helpers.paths import REPO

__all__ = [
    "ERROR_NAMES",
    "LIB_NAME",
    "LOG_ENV",
    "NVML_VALUE_NOT_AVAILABLE",
    "STATE_ENV",
    "FakeGpu",
    "FakeNvmlState",
    "FakeProcess",
    "FakeXid",
    "build_fake_nvml",
    "fake_nvml_env",
]

REPO_ROOT = REPO
SOURCE_DIR = REPO_ROOT / "tests" / "fakenvml"
DEFAULT_BUILD_DIR = REPO_ROOT / "build" / "fakenvml"
LIB_NAME = "libnvidia-ml.so.1"
STATE_ENV = "TRAINGUARD_FAKE_NVML_STATE"
LOG_ENV = "TRAINGUARD_FAKE_NVML_LOG"
# NVML_VALUE_NOT_AVAILABLE for 64-bit values. pynvml turns it into None for
# a process's usedGpuMemory (WDDM / WSL report it so).
NVML_VALUE_NOT_AVAILABLE = 0xFFFF_FFFF_FFFF_FFFF
GIB = 1 << 30
# nvmlEventType* bits: what a data-centre GPU on Linux reports as supported (SBE, DBE, PState,
# critical Xid, clock), and the critical-Xid bit alone
DEFAULT_EVENTS = 0x1F
XID_EVENT = 0x8
# nvmlClocksEventReason* bits (nvml.h; the older nvmlClocksThrottleReason* are the same values)
REASON_GPU_IDLE = 0x1
REASON_APPLICATIONS_CLOCKS_SETTING = 0x2
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_SYNC_BOOST = 0x10
REASON_SW_THERMAL_SLOWDOWN = 0x20
REASON_HW_THERMAL_SLOWDOWN = 0x40
REASON_HW_POWER_BRAKE_SLOWDOWN = 0x80
REASON_DISPLAY_CLOCK_SETTING = 0x100

# Error names the state file accepts: NVML_ERROR_<NAME> in lower case.
ERROR_NAMES = frozenset(
    [
        "uninitialized",
        "invalid_argument",
        "not_supported",
        "no_permission",
        "already_initialized",
        "not_found",
        "insufficient_size",
        "insufficient_power",
        "driver_not_loaded",
        "timeout",
        "irq_issue",
        "library_not_found",
        "function_not_found",
        "corrupted_inforom",
        "gpu_is_lost",
        "reset_required",
        "operating_system",
        "lib_rm_version_mismatch",
        "in_use",
        "memory",
        "no_data",
        "vgpu_ecc_not_supported",
        "insufficient_resources",
        "freq_not_supported",
        "argument_version_mismatch",
        "deprecated",
        "not_ready",
        "gpu_not_found",
        "invalid_state",
        "reset_type_not_supported",
        "unknown",
    ]
)

ProcessKind = Literal["compute", "graphics", "mps"]


def build_fake_nvml(outdir: Path | None = None) -> Path:
    """Build the fake library if needed; return the directory holding it.

    Rebuilds when ``libnvidia-ml.so.1`` is missing or older than
    ``fakenvml.c`` or ``build.sh``. Raises RuntimeError with the compiler's
    output when the build fails (e.g. no gcc).
    """
    outdir = Path(outdir) if outdir is not None else DEFAULT_BUILD_DIR
    lib = outdir / LIB_NAME
    sources = [SOURCE_DIR / "fakenvml.c", SOURCE_DIR / "build.sh"]
    link = outdir / "libnvidia-ml.so"
    try:
        lib_mtime = lib.stat().st_mtime_ns
        up_to_date = link.is_symlink() and all(s.stat().st_mtime_ns <= lib_mtime for s in sources)
    except FileNotFoundError:
        up_to_date = False
    if not up_to_date:
        try:
            proc = subprocess.run(
                ["sh", str(SOURCE_DIR / "build.sh"), str(outdir)],
                capture_output=True,
                text=True,
                check=False,
            )
        except OSError as exc:
            raise RuntimeError(f"cannot run build.sh for the fake NVML library: {exc}") from exc
        if proc.returncode != 0:
            raise RuntimeError(
                f"building the fake NVML library failed (exit {proc.returncode}):\n"
                f"{proc.stdout}{proc.stderr}"
            )
    return outdir


def fake_nvml_env(
    state_path: str | os.PathLike[str],
    *,
    lib_dir: Path | None = None,
    log_path: str | os.PathLike[str] | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Return a complete environment for a child process that uses the fake NVML.

    Starts from ``base`` (default: ``os.environ``), prefixes ``LD_LIBRARY_PATH``
    with the library directory (built on demand when ``lib_dir`` is None) and
    sets ``TRAINGUARD_FAKE_NVML_STATE``. With ``log_path``, the library appends
    one line per NVML call (``<symbol> <return code>``) to that file.
    """
    env = dict(os.environ if base is None else base)
    libdir = str(lib_dir if lib_dir is not None else build_fake_nvml())
    old = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = f"{libdir}:{old}" if old else libdir
    env[STATE_ENV] = os.fspath(state_path)
    if log_path is not None:
        env[LOG_ENV] = os.fspath(log_path)
    else:
        env.pop(LOG_ENV, None)
    return env


def _escape(value: str) -> str:
    """Encode a string for the state file: space is '_', other specials are %XX."""
    if not value:
        raise ValueError("empty strings cannot be written to the state file")
    if "\0" in value:
        raise ValueError("NUL cannot be written to the state file")
    out = []
    for ch in value:
        if ch == " ":
            out.append("_")
        elif ch.isascii() and (ch.isalnum() or ch in ".-:/+,"):
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode())
    return "".join(out)


def _check_error(name: str) -> str:
    if name not in ERROR_NAMES:
        raise ValueError(f"unknown NVML error name {name!r}; one of {sorted(ERROR_NAMES)}")
    return name


def _na(value: int | None) -> str:
    return "NA" if value is None else str(int(value))


@dataclass
class FakeGpu:
    """One device. ``used`` is what nvmlDeviceGetMemoryInfo (v1) reports as used;
    ``reserved`` (part of ``used``) is split out by nvmlDeviceGetMemoryInfo_v2."""

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    total: int = 80 * GIB
    used: int = 0
    reserved: int = 0
    lost: bool = False
    error: str | None = None  # every query on the device returns this NVML error
    temperature: int = 40
    utilization: int = 0
    memory_utilization: int = 0
    xid_events: bool = True  # False: the driver offers no critical-Xid events (WDDM, vGPU)
    # health (nvml.h semantics; set them on the FakeGpu add_gpu returns)
    clock_event_reasons: int | None = None  # nvmlClocksEventReason* bits; None: GpuIdle iff util 0
    pcie_generation: int = 5
    pcie_max_generation: int = 5  # what GPU and slot allow together (nvmlDeviceGetMaxPcie...)
    pcie_gpu_max_generation: int | None = None  # the GPU alone; None: pcie_max_generation
    pcie_width: int = 16
    pcie_max_width: int = 16
    power_mw: int = 70_000
    power_limit_mw: int = 700_000  # enforced
    ecc_corrected: int = 0  # volatile: since the driver loaded
    ecc_uncorrected: int = 0
    ecc_corrected_aggregate: int | None = None  # lifetime; None: the volatile count
    ecc_uncorrected_aggregate: int | None = None
    remapped_corrected: int = 0
    remapped_uncorrected: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    temperature_slowdown: int = 87
    temperature_shutdown: int = 92
    # page retirement: True is a GPU before Ampere (retired pages answer, remapped rows are
    # NOT_SUPPORTED); False (an H100) the reverse
    page_retirement: bool = False
    retired_sbe: int = 0  # pages retired for multiple single-bit ECC errors
    retired_dbe: int = 0  # for a double-bit ECC error
    retired_pending: bool = False  # a retirement waits for a reboot / GPU reset
    # NVLink: links 0..nvlinks-1 (0: a PCIe card, NOT_SUPPORTED); nvlink_down: inactive links' bits
    nvlinks: int = 0
    nvlink_down: int = 0
    # (link, counter) -> count; counter: replay, recovery, crc_flit, crc_data
    nvlink_errors: dict[tuple[int, str], int] = field(default_factory=dict)

    def line(self, index: int) -> str:
        if not 0 <= self.reserved <= self.used <= self.total:
            raise ValueError(f"gpu {index}: need 0 <= reserved <= used <= total")
        parts = [
            f"gpu {index}",
            f"uuid={_escape(self.uuid)}",
            f"name={_escape(self.name)}",
            f"total={self.total}",
            f"used={self.used}",
            f"reserved={self.reserved}",
            f"lost={int(self.lost)}",
            f"temp={self.temperature}",
            f"util={self.utilization}",
            f"memutil={self.memory_utilization}",
            f"events={DEFAULT_EVENTS if self.xid_events else DEFAULT_EVENTS & ~XID_EVENT:#x}",
        ]
        parts += [
            f"pcie_gen={self.pcie_generation}",
            f"pcie_max_gen={self.pcie_max_generation}",
            f"pcie_width={self.pcie_width}",
            f"pcie_max_width={self.pcie_max_width}",
            f"power={self.power_mw}",
            f"power_limit={self.power_limit_mw}",
            f"ecc_corrected={self.ecc_corrected}",
            f"ecc_uncorrected={self.ecc_uncorrected}",
            f"remap_corrected={self.remapped_corrected}",
            f"remap_uncorrected={self.remapped_uncorrected}",
            f"remap_pending={int(self.remap_pending)}",
            f"remap_failure={int(self.remap_failure)}",
            f"temp_slowdown={self.temperature_slowdown}",
            f"temp_shutdown={self.temperature_shutdown}",
            f"retirement={int(self.page_retirement)}",
            f"retired_sbe={self.retired_sbe}",
            f"retired_dbe={self.retired_dbe}",
            f"retired_pending={int(self.retired_pending)}",
            f"nvlinks={self.nvlinks}",
            f"nvlink_down={self.nvlink_down:#x}",
        ]
        parts += [
            f"nvlink{link}_{counter}={n}" for (link, counter), n in self.nvlink_errors.items()
        ]
        for key, value in (
            ("reasons", self.clock_event_reasons),
            ("pcie_gpu_max_gen", self.pcie_gpu_max_generation),
            ("ecc_corrected_aggregate", self.ecc_corrected_aggregate),
            ("ecc_uncorrected_aggregate", self.ecc_uncorrected_aggregate),
        ):
            if value is not None:
                parts.append(f"{key}={value:#x}" if key == "reasons" else f"{key}={value}")
        if self.error is not None:
            parts.append(f"error={_check_error(self.error)}")
        return " ".join(parts)


@dataclass
class FakeProcess:
    """One process on one device. ``used=None`` is NVML_VALUE_NOT_AVAILABLE;
    instance ids of None are what a GPU without MIG reports (0xFFFFFFFF)."""

    gpu: int
    pid: int
    used: int | None
    kind: ProcessKind = "compute"
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    def line(self) -> str:
        if self.kind not in ("compute", "graphics", "mps"):
            raise ValueError(f"process kind must be compute, graphics or mps, not {self.kind!r}")
        return (
            f"proc {self.gpu} {self.kind} pid={self.pid} used={_na(self.used)}"
            f" gi={_na(self.gpu_instance_id)} ci={_na(self.compute_instance_id)}"
        )


@dataclass
class FakeXid:
    """One critical-Xid event on device ``gpu``: delivered once per process (to the first event
    set that watches the device for Xids and waits), whatever later rewrites of the file do."""

    gpu: int
    code: int
    id: int

    def line(self) -> str:
        return f"xid {self.gpu} {int(self.code)} id={int(self.id)}"


@dataclass
class FakeNvmlState:
    """What the fake NVML reports. Mutate it and :meth:`write` it again to
    change what an already running child sees at its next NVML call."""

    driver_version: str = "550.54.15"
    cuda_version: int = 12040
    nvml_version: str | None = None  # None: "<cuda major>.<driver_version>"
    init_error: str | None = None  # e.g. "driver_not_loaded": nvmlInit fails with it
    gpus: list[FakeGpu] = field(default_factory=list)
    processes: list[FakeProcess] = field(default_factory=list)
    failures: list[tuple[str, str, int | None]] = field(default_factory=list)
    hangs: list[tuple[str, int]] = field(default_factory=list)
    xids: list[FakeXid] = field(default_factory=list)

    def add_gpu(
        self,
        uuid: str | None = None,
        *,
        name: str = "NVIDIA H100 80GB HBM3",
        total: int = 80 * GIB,
        used: int = 0,
        reserved: int = 0,
        lost: bool = False,
        error: str | None = None,
        temperature: int = 40,
        utilization: int = 0,
        memory_utilization: int = 0,
        xid_events: bool = True,
    ) -> FakeGpu:
        """Append a device; its index is its position. The default uuid is
        ``GPU-<index:08x>-0000-4000-8000-<index:012x>``."""
        index = len(self.gpus)
        if uuid is None:
            uuid = f"GPU-{index:08x}-0000-4000-8000-{index:012x}"
        gpu = FakeGpu(
            uuid,
            name=name,
            total=total,
            used=used,
            reserved=reserved,
            lost=lost,
            error=error,
            temperature=temperature,
            utilization=utilization,
            memory_utilization=memory_utilization,
            xid_events=xid_events,
        )
        self.gpus.append(gpu)
        return gpu

    def add_process(
        self,
        gpu: int,
        pid: int,
        used: int | None,
        kind: ProcessKind = "compute",
        *,
        gpu_instance_id: int | None = None,
        compute_instance_id: int | None = None,
    ) -> FakeProcess:
        """Add a process on device ``gpu``; ``used=None`` means not available."""
        proc = FakeProcess(gpu, pid, used, kind, gpu_instance_id, compute_instance_id)
        self.processes.append(proc)
        return proc

    def add_xid(self, gpu: int, code: int) -> FakeXid:
        """Queue a critical-Xid event (``code``, e.g. 79) on device ``gpu``. Keep it in the
        state: an event is delivered once however often the file is written again."""
        xid = FakeXid(gpu, code, max((x.id for x in self.xids), default=0) + 1)
        self.xids.append(xid)
        return xid

    def fail(self, symbol: str, error: str, gpu: int | None = None) -> None:
        """Make the NVML entry point ``symbol`` (exact C name, e.g.
        ``nvmlDeviceGetComputeRunningProcesses_v3``) return ``error``, on one
        device or (gpu=None) on all devices and for system-level calls."""
        self.failures.append((symbol, _check_error(error), gpu))

    def hang(self, symbol: str, seconds: float) -> None:
        """Make every call of ``symbol`` sleep ``seconds`` holding the library's lock (so every
        other call waits too), like a driver stuck on a GPU in a bad state."""
        self.hangs.append((symbol, round(seconds * 1000)))

    def render(self) -> str:
        """The state file's text."""
        lines = [
            "# written by tests/helpers/nvml_fake.py",
            f"driver {_escape(self.driver_version)}",
        ]
        lines.append(f"cuda {int(self.cuda_version)}")
        if self.nvml_version is not None:
            lines.append(f"nvml {_escape(self.nvml_version)}")
        lines.append(f"init {_check_error(self.init_error) if self.init_error else 'ok'}")
        lines.extend(gpu.line(i) for i, gpu in enumerate(self.gpus))
        for proc in self.processes:
            if not 0 <= proc.gpu < len(self.gpus):
                raise ValueError(f"process {proc.pid} is on gpu {proc.gpu}, which is not listed")
            lines.append(proc.line())
        for symbol, error, gpu in self.failures:
            lines.append(f"fail {symbol} {error}" + ("" if gpu is None else f" gpu={gpu}"))
        for symbol, ms in self.hangs:
            lines.append(f"hang {symbol} {ms}")
        for xid in self.xids:
            if not 0 <= xid.gpu < len(self.gpus):
                raise ValueError(f"xid {xid.id} is on gpu {xid.gpu}, which is not listed")
            lines.append(xid.line())
        return "\n".join(lines) + "\n"

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the state file atomically (temp file in the same directory + os.replace)."""
        target = Path(path)
        text = self.render()
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target

    def env(
        self,
        path: str | os.PathLike[str],
        *,
        log_path: str | os.PathLike[str] | None = None,
        base: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """The environment for a child process reading this state from ``path``
        (see :func:`fake_nvml_env`; it does not write the file)."""
        return fake_nvml_env(path, log_path=log_path, base=base)
