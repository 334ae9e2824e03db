"""What the device run found before testing: Python, the packages that matter, the NVIDIA
driver through NVML and CUDA through torch. Prints one JSON object; ``gpu_ok`` is true only
when both a real driver and a CUDA device are there (else ``problem`` says why). Never raises:
tests/gpu/run-on-device.sh must always get an answer to put in its report.

    python tests/gpu/probe.py"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
from importlib import metadata
from typing import Any

PACKAGES = (
    "torch",
    "nvidia-ml-py",
    "prometheus-client",
    "psutil",
    "PyYAML",
    "bcrypt",
    "pytest",
    "pytest-timeout",
    "hypothesis",
    "nvitop",
    "nvitop-exporter",
)


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def nvml() -> dict[str, Any]:
    try:
        import pynvml
    except Exception as exc:
        return {"problem": f"pynvml cannot be imported: {exc!r}"}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        return {"problem": "NVML library not found", "library_missing": True}
    except Exception as exc:
        return {"problem": f"nvmlInit failed: {exc!r}"}
    try:
        library = str(getattr(pynvml.nvmlLib, "_name", ""))
        out: dict[str, Any] = {
            "driver": str(pynvml.nvmlSystemGetDriverVersion()),
            "library": library,
        }
        if "fakenvml" in library:
            out["problem"] = f"NVML is the test library ({library})"
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            gpus.append(
                {
                    "index": i,
                    "name": str(pynvml.nvmlDeviceGetName(h)),
                    "uuid": str(pynvml.nvmlDeviceGetUUID(h)),
                    "total_mib": mem.total >> 20,
                    "used_mib": mem.used >> 20,
                    "processes": len(pynvml.nvmlDeviceGetComputeRunningProcesses(h)),
                }
            )
        out["gpus"] = gpus
        if not gpus:
            out["problem"] = "NVML lists no GPU"
        return out
    except Exception as exc:
        return {"problem": f"NVML failed: {exc!r}"}
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def cuda() -> dict[str, Any]:
    try:
        import torch
    except Exception as exc:
        return {"problem": f"torch cannot be imported: {exc!r}"}
    out: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        out["available"] = bool(torch.cuda.is_available())
        if not out["available"]:
            out["problem"] = "no CUDA: torch.cuda.is_available() is False"
            return out
        out["device_count"] = torch.cuda.device_count()
        props = torch.cuda.get_device_properties(0)
        out["device0"] = {
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "total_mib": props.total_memory >> 20,
            "uuid": str(props.uuid),
        }
    except Exception as exc:
        out["problem"] = f"no CUDA: {exc!r}"
    return out


def main() -> None:
    report: dict[str, Any] = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "machine": platform.machine(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "packages": versions(),
    }
    report["nvml"] = nvml()
    # asked even without a driver: the report says what torch is there either way
    report["cuda"] = cuda()
    problems = [p["problem"] for p in (report["nvml"], report["cuda"]) if "problem" in p]
    report["gpu_ok"] = not problems
    if problems:
        report["problem"] = "; ".join(problems)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
