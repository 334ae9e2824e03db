"""What a training script pays to import trainguard, against what the exporter side costs, side
by side in one run (and, with ``--baseline REV``, against an older revision of the package).

    python bench/bench_import.py                      # this checkout
    python bench/bench_import.py --baseline 3de48e7   # also the package as it was at 3de48e7

Each case runs in a fresh interpreter ``--runs`` times (the cases interleaved, so a busy
machine slows them alike); the import is timed in-process with ``perf_counter`` and the modules
it loaded are counted. Medians are reported, and ratios against the training side of this
checkout; each case is run once untimed first, so bytecode caches are warm. ``python -X
importtime`` then names the largest imports of the training side.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CASES = {
    "training side (import trainguard; trainguard.Run; import trainguard.checkpoint)": (
        "import trainguard\ntrainguard.Run\nimport trainguard.checkpoint"
    ),
    "exporter side (import trainguard.exporter.cli)": "import trainguard.exporter.cli",
}
BASELINE_CASE = "import trainguard\ntrainguard.Run\nimport trainguard.checkpoint"

PROBE = """
import json, sys, time
before = set(sys.modules)
t = time.perf_counter()
exec(compile({code!r}, "<bench>", "exec"))
dt = time.perf_counter() - t
print(json.dumps({{"ms": dt * 1000, "modules": len(set(sys.modules) - before),
                  "heavy": sorted({{m.split(".")[0] for m in sys.modules}} &
                                  {{"yaml", "prometheus_client", "bcrypt", "pynvml", "torch"}})}}))
"""


def measure(src: Path, code: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(code=code)],
        env={"PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def importtime_rows(src: Path, code: str) -> dict[str, int]:
    """Cumulative microseconds per imported module, from ``python -X importtime``."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        env={"PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
        check=True,
    )
    rows: dict[str, int] = {}
    for line in out.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows[parts[2].strip()] = int(parts[1])
    return rows


def importtime_top(src: Path, code: str, n: int = 8) -> list[str]:
    """The largest imports ``code`` adds to a bare interpreter's start-up."""
    startup = importtime_rows(src, "pass")
    rows = {m: us for m, us in importtime_rows(src, code).items() if m not in startup}
    top = sorted(rows.items(), key=lambda kv: kv[1], reverse=True)[:n]
    return [f"{us / 1000:6.1f} ms  {name}" for name, us in top]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--baseline", help="a git revision to compare the training side with")
    args = ap.parse_args()

    cases = {name: (REPO / "exporter", code) for name, code in CASES.items()}
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline:
            base = Path(tmp) / "baseline"
            archive = subprocess.run(
                ["git", "-C", str(REPO), "archive", args.baseline, "exporter"],
                capture_output=True,
                check=True,
            ).stdout
            base.mkdir()
            subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
            cases[f"training side at {args.baseline}"] = (base / "exporter", BASELINE_CASE)
        samples: dict[str, list[dict[str, object]]] = {name: [] for name in cases}
        for src, code in cases.values():
            measure(src, code)  # compiles the bytecode caches: every case is timed warm
        for _ in range(args.runs):
            for name, (src, code) in cases.items():
                samples[name].append(measure(src, code))
        first = next(iter(cases))
        ref = statistics.median(float(str(s["ms"])) for s in samples[first])
        print(f"python {sys.version.split()[0]}, {args.runs} fresh interpreters per case")
        print(f"{'case':<82} {'median ms':>9} {'ratio':>6} {'modules':>7}  heavy")
        for name, runs in samples.items():
            ms = statistics.median(float(str(s["ms"])) for s in runs)
            modules = statistics.median(int(str(s["modules"])) for s in runs)
            heavy = ",".join(str(h) for h in runs[0]["heavy"]) or "-"  # type: ignore[attr-defined]
            print(f"{name:<82} {ms:>9.1f} {ms / ref:>6.2f} {modules:>7.0f}  {heavy}")
        print("\nlargest imports of the training side (python -X importtime, cumulative):")
        for row in importtime_top(REPO / "exporter", CASES[first]):
            print("  " + row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
