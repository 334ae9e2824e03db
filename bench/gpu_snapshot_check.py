"""GPU check of the memory snapshots (issue 19), for a machine with CUDA (issue 18 runs it):

    PYTHONPATH=exporter python bench/gpu_snapshot_check.py [--out DIR] [--seconds 120]

What only a real GPU shows, and the CPU tests cannot:

1. A real CUDA training child, ``trainguard.Run(oom_snapshots=True, snapshot_steps=50)``, that
   leaks (keeps one tensor per step) while it steps. The check waits for two periodic
   snapshots, asks for one with the real ``trainguard snapshot`` command, then tells the child to
   allocate until a real ``torch.OutOfMemoryError`` inside ``run.capture_oom()``.
2. Every snapshot written loads with ``pickle`` and renders through
   ``torch.cuda._memory_viz.trace_plot`` and ``segment_plot`` (the code behind memory_viz's
   pages); its ``.json`` names the GPU (name, UUID, size) and the CUDA version; the OOM's
   ``oom-1.before`` file exists; the heartbeat's counts moved.
3. Figures: bytes per snapshot, and the longest pause of the child's step loop around each dump
   (a dump holds the GIL while it builds and pickles the snapshot).

Writes ``DIR/gpu_snapshot_check.json`` and prints a summary. Exit 0 when every check passed, 1
when one failed, 77 without CUDA (nothing checked: it stops before the first CUDA call).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CHILD = r"""
import json, os, sys, time
import torch
import trainguard

state, seconds = sys.argv[1], float(sys.argv[2])
run = trainguard.Run("gpu-check", state_dir=state, interval=0.2, oom_snapshots=True,
                     snapshot_steps=50, snapshot_keep=3, config={"batch_size": 16, "check": 1})
x = torch.randn(1024, 1024, device="cuda")
kept, times, step = [], [], 0
deadline = time.monotonic() + seconds
while time.monotonic() < deadline and not os.path.exists(os.path.join(state, "oom-now")):
    y = x @ x
    kept.append(y[:64].clone())  # the leak: 256 KiB kept per step
    torch.cuda.synchronize()
    times.append(time.time())
    run.step(step, loss=float(y[0, 0]), batch_size=16)
    step += 1
    time.sleep(0.01)
oom = False
if os.path.exists(os.path.join(state, "oom-now")):
    hog = []
    try:
        with run.capture_oom():
            while True:
                hog.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
    except torch.cuda.OutOfMemoryError:
        oom = True
    del hog
gaps = sorted(((b - a, a) for a, b in zip(times, times[1:])), reverse=True)[:20]
with open(os.path.join(state, "child.json"), "w") as f:
    json.dump({"steps": step, "oom": oom, "gaps": gaps,
               "last_oom_snapshot": str(run.last_oom_snapshot)}, f)
run.close()
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    p.add_argument("--seconds", type=float, default=120.0, help="the child's step budget")
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_snapshot_check: no CUDA on this machine: nothing checked", file=sys.stderr)
        return 77
    from trainguard.shared.heartbeat.read import read_heartbeat
    from trainguard.shared.heartbeat.record import heartbeat_filename

    report: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    checks: dict[str, bool] = {}
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "exporter")}
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(state), str(args.seconds)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        hb_path = state / heartbeat_filename("gpu-check", 0)

        def hb_counts() -> dict[str, int]:
            try:
                hb = read_heartbeat(hb_path)
            except Exception:
                return {}
            return dict(hb.snapshots.counts) if hb.snapshots else {}

        deadline = time.monotonic() + args.seconds
        while hb_counts().get("periodic", 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        checks["two periodic snapshots"] = hb_counts().get("periodic", 0) >= 2
        started = time.monotonic()
        asked = subprocess.run(
            [
                *(sys.executable, "-m", "trainguard.exporter.terminal", "snapshot", "gpu-check"),
                *("--state.dir", str(state), "--json", "--timeout", "120"),
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        report["requested_reply_s"] = time.monotonic() - started
        report["requested"] = asked.stdout.strip() or asked.stderr.strip()
        checks["trainguard snapshot answered"] = asked.returncode == 0
        (state / "oom-now").write_text("")
        out, _ = child.communicate(timeout=args.seconds + 300)
        report["child_log_tail"] = out[-2000:]
        checks["child exited 0"] = child.returncode == 0
        child_doc = json.loads((state / "child.json").read_text())
        report["child"] = child_doc
        checks["real OutOfMemoryError"] = bool(child_doc["oom"])
        hb = read_heartbeat(hb_path)
        report["heartbeat_snapshots"] = hb.snapshots.to_dict() if hb.snapshots else None
        checks["oom counted"] = hb.memory_snapshots >= 1
        snaps = sorted(state.glob("*.pickle"))
        report["files"] = {p.name: p.stat().st_size for p in snaps}
        checks["oom-1.before kept"] = any(p.name.endswith(".oom-1.before.pickle") for p in snaps)
        from torch.cuda import _memory_viz

        renders: dict[str, Any] = {}
        for path in snaps:
            entry: dict[str, Any] = {"bytes": path.stat().st_size}
            try:
                with open(path, "rb") as f:
                    data = pickle.load(f)
                entry["segments"] = len(data.get("segments", []))
                entry["trace_events"] = sum(len(t) for t in data.get("device_traces", []))
                entry["trace_plot_bytes"] = len(_memory_viz.trace_plot(data))
                entry["segment_plot_bytes"] = len(_memory_viz.segment_plot(data))
                meta = json.loads(path.with_suffix(".json").read_text())
                dev = (meta.get("devices") or [{}])[0]
                entry["meta"] = {
                    k: meta.get(k) for k in ("reason", "step", "time", "cuda_version", "batch_size")
                }
                entry["gpu"] = {k: dev.get(k) for k in ("name", "uuid", "total_bytes")}
                entry["ok"] = bool(entry["segments"]) and all(entry["gpu"].values())
            except Exception as exc:
                entry["ok"], entry["error"] = False, repr(exc)
            renders[path.name] = entry
        report["snapshots"] = renders
        checks["every snapshot loads and renders"] = bool(renders) and all(
            e["ok"] for e in renders.values()
        )
    report["checks"] = checks
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_snapshot_check.json").write_text(json.dumps(report, indent=2, default=str))
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'} {name}")
    for name, e in report.get("snapshots", {}).items():
        print(f"  {name}: {e.get('bytes')} bytes, {e.get('segments')} segments, ok={e.get('ok')}")
    print(f"  longest step pauses (s, at): {report['child']['gaps'][:3]}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
