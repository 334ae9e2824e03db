"""The ``gpu`` tests need a real NVIDIA driver (NVML, not the test library) and CUDA through
torch; anywhere else they are skipped, with the reason, so ``./run-tests`` is unchanged on
machines without a GPU. ``TRAINGUARD_GPU_REQUIRED=1`` (tests/gpu/run-on-device.sh sets it
once its own probe found a GPU) turns that skip into a failure: on the device machine a
skipped test must never read as a pass.

``figures``: what a test measured (context size, driver vs allocator bytes...), printed and,
with ``TRAINGUARD_GPU_FIGURES=FILE``, appended to FILE as one JSON line per test for the
device report (tests/gpu/report.py)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

REQUIRED_ENV = "TRAINGUARD_GPU_REQUIRED"
FIGURES_ENV = "TRAINGUARD_GPU_FIGURES"

CUDA_PROBE = """
import json
try:
    import torch
except Exception as exc:
    print(json.dumps({"problem": f"torch cannot be imported: {exc!r}"}))
else:
    print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda,
                      "available": torch.cuda.is_available(),
                      "count": torch.cuda.device_count()}))
"""


def nvml_problem() -> str | None:
    """Why there is no real NVIDIA driver here (None when there is one). Asked in this
    process: nvmlInit creates no CUDA context and holds no GPU memory."""
    if os.environ.get("TRAINGUARD_FAKE_NVML_STATE"):
        return "TRAINGUARD_FAKE_NVML_STATE is set: NVML would be the test library"
    try:
        import pynvml
    except ImportError as exc:
        return f"pynvml (nvidia-ml-py) cannot be imported: {exc}"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        return "no NVIDIA driver: the NVML library (libnvidia-ml.so.1) cannot be loaded"
    except pynvml.NVMLError as exc:
        return f"NVML does not start: {exc}"
    try:
        library = str(getattr(pynvml.nvmlLib, "_name", ""))
        if "fakenvml" in library:
            return f"NVML is the test library ({library}), not a driver"
        if pynvml.nvmlDeviceGetCount() < 1:
            return "NVML starts but lists no GPU"
    except pynvml.NVMLError as exc:
        return f"NVML fails listing GPUs: {exc}"
    finally:
        pynvml.nvmlShutdown()
    return None


def cuda_problem() -> str | None:
    """Why torch has no CUDA device here; asked in a child so this process never imports
    torch nor initialises CUDA (the tests count the GPU's processes)."""
    out = subprocess.run(
        [sys.executable, "-c", CUDA_PROBE], capture_output=True, text=True, timeout=300
    )
    try:
        probe = json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return f"the CUDA probe failed: {out.stderr.strip()[-500:]}"
    if "problem" in probe:
        return str(probe["problem"])
    if not probe["available"]:
        return f"torch {probe['torch']} (CUDA {probe['cuda']}): torch.cuda.is_available() is False"
    return None


@functools.cache
def gpu_problem() -> str | None:
    """Why the gpu tests cannot run here, or None. Without a driver CUDA cannot work either,
    so torch is not asked then (it costs seconds on every suite run)."""
    nvml = nvml_problem()
    if nvml is not None:
        return f"needs a real NVIDIA GPU: {nvml} (torch.cuda therefore unavailable too)"
    cuda = cuda_problem()
    if cuda is not None:
        return f"needs CUDA through torch: {cuda}"
    return None


@pytest.fixture(autouse=True)
def _real_gpu() -> None:
    problem = gpu_problem()
    if problem is None:
        return
    if os.environ.get(REQUIRED_ENV) == "1":
        pytest.fail(f"{REQUIRED_ENV}=1 but {problem}")
    pytest.skip(problem)


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """What the test measured; kept even when it fails half-way (that is when it matters)."""
    found: dict[str, Any] = {}
    yield found
    if not found:
        return
    line = json.dumps({"test": request.node.nodeid, "figures": found}, sort_keys=True)
    print(f"figures: {line}")
    path = os.environ.get(FIGURES_ENV)
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")
