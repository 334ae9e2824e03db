"""A real CUDA training process for the GPU tests: ``trainguard.Run`` plus torch, driven one
command at a time so that a test knows exactly what the allocator holds when it scrapes.

    python tests/gpu/cuda_child.py NAME STATE_DIR [--oom-snapshots]

Reads one JSON command per line on stdin and answers one JSON line on stdout (``{"error":
...}`` when a command fails; the process stays up). The allocator's numbers in a ``step``
answer are read after ``torch.cuda.synchronize()`` and before ``run.step()``: nothing
allocates between them and the heartbeat that carries that step, so the exporter's gauges for
that step must equal them exactly. Ends at EOF or ``{"op": "exit"}`` (``run.close()``)."""

from __future__ import annotations

import base64
import json
import os
import pickle
import sys
import time
import traceback
from typing import Any

import torch

import trainguard

#: memory_stats keys the heartbeat carries (see trainguard.run.allocator)
STATS = (
    "allocated_bytes.all.current",
    "reserved_bytes.all.current",
    "allocated_bytes.all.peak",
    "inactive_split_bytes.all.current",
    "num_alloc_retries",
    "num_ooms",
)


class Child:
    def __init__(self, name: str, state_dir: str, oom_snapshots: bool) -> None:
        self.run = trainguard.Run(
            name, state_dir=state_dir, interval=0.05, oom_snapshots=oom_snapshots
        )
        self.tensors: dict[str, torch.Tensor] = {}

    def op_init(self) -> dict[str, Any]:
        """Create the CUDA context and load the kernels the other commands use (lazy module
        loading would otherwise add device memory at their first use)."""
        torch.cuda.set_device(0)
        x = torch.ones(1, device="cuda")
        x.add_(1)
        y = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        y.fill_(1)
        del x, y
        torch.cuda.synchronize()
        props = torch.cuda.get_device_properties(0)
        return {
            "uuid": str(props.uuid),
            "name": props.name,
            "total": int(props.total_memory),
            "device_count": torch.cuda.device_count(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        }

    def op_alloc(self, name: str, nbytes: int, fill: bool = True) -> dict[str, Any]:
        t = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        if fill:
            t.fill_(1)
        self.tensors[name] = t
        torch.cuda.synchronize()
        return {"ok": name}

    def op_free(self, names: list[str]) -> dict[str, Any]:
        for name in names:
            del self.tensors[name]
        torch.cuda.synchronize()
        return {"ok": names}

    def op_step(self, step: int) -> dict[str, Any]:
        torch.cuda.synchronize()
        stats = torch.cuda.memory_stats(0)
        out = {k: int(stats.get(k, 0)) for k in STATS}
        out["memory_reserved"] = int(torch.cuda.memory_reserved(0))
        out["memory_allocated"] = int(torch.cuda.memory_allocated(0))
        self.run.step(step, loss=1.0 / (step + 1))
        return {"step": step, "stats": out}

    def op_oom(self, chunk: int) -> dict[str, Any]:
        """Allocate ``chunk`` bytes at a time until CUDA runs out of memory for real, inside
        ``run.capture_oom()``; free everything again afterwards."""
        chunks = []
        message = None
        failed = dumped = time.monotonic()
        try:
            with self.run.capture_oom():
                try:
                    while True:
                        chunks.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
                except torch.cuda.OutOfMemoryError:
                    failed = time.monotonic()
                    raise
        except torch.cuda.OutOfMemoryError as exc:
            dumped = time.monotonic()  # capture_oom() wrote the snapshot in between
            message = str(exc).splitlines()[0][:300]
        held = len(chunks)
        chunks.clear()
        torch.cuda.synchronize()
        snap = self.run.last_oom_snapshot
        return {
            "chunks": held,
            "error": message,
            "snapshot": str(snap) if snap else None,
            "dump_seconds": round(dumped - failed, 3),
        }

    def op_share(self, name: str) -> dict[str, Any]:
        """What another process needs to map tensor ``name`` through CUDA IPC (torch's own
        reduction, as torch.multiprocessing sends it), pickled and base64-encoded."""
        from torch.multiprocessing.reductions import reduce_tensor

        payload = pickle.dumps(reduce_tensor(self.tensors[name]))
        return {"payload": base64.b64encode(payload).decode()}

    def op_busy(self, seconds: float) -> dict[str, Any]:
        """Keep the GPU busy with matrix multiplications for ``seconds``, stepping the run.

        So the GPU health readings (utilisation, power, clocks, PCIe link) are those of a GPU
        doing real work, as a training run's is."""
        a = torch.randn(4096, 4096, device="cuda")
        b = torch.randn(4096, 4096, device="cuda")
        end = time.monotonic() + seconds
        rounds = 0
        while time.monotonic() < end:
            for _ in range(20):
                a = torch.mm(a, b)
                a = a / a.norm()
            torch.cuda.synchronize()
            rounds += 1
            self.run.step(rounds, loss=float(rounds))
        return {"rounds": rounds}

    def op_exit(self) -> dict[str, Any]:
        self.run.close()
        return {"ok": "exit"}


def main() -> None:
    name, state_dir = sys.argv[1], sys.argv[2]
    child = Child(name, state_dir, "--oom-snapshots" in sys.argv[3:])
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        op = cmd.pop("op")
        try:
            answer = getattr(child, f"op_{op}")(**cmd)
        except Exception as exc:
            answer = {
                "error": f"{op}: {type(exc).__name__}: {exc}",
                "trace": traceback.format_exc(),
            }
        print(json.dumps(answer), flush=True)
        if op == "exit":
            return


if __name__ == "__main__":
    main()
