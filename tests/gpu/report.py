"""Turn what tests/gpu/run-on-device.sh collected into ``report.json`` and ``report.md`` (and
print the Markdown: the device tool returns the end of the output). Standard library only, and
it never fails on a missing or broken input: each one missing is said in the report.

    python tests/gpu/report.py OUT_DIR WORK_DIR

OUT_DIR holds junit.xml, figures.jsonl and bench.json (when those phases ran); WORK_DIR holds
probe.json and phases.jsonl (one ``{"phase", "rc", "seconds", "limit"}`` per phase)."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

TIMEOUT_RCS = (124, 137)


def load_json(path: Path) -> tuple[Any, str | None]:
    try:
        return json.loads(path.read_text()), None
    except FileNotFoundError:
        return None, f"{path.name}: missing"
    except (OSError, ValueError) as exc:
        return None, f"{path.name}: unreadable ({exc})"


def load_lines(path: Path) -> tuple[list[Any], str | None]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return [], f"{path.name}: missing"
    out, bad = [], 0
    for line in text.splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError:
                bad += 1
    return out, (f"{path.name}: {bad} unreadable line(s)" if bad else None)


def tests_from_junit(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    try:
        root = ET.parse(path).getroot()
    except FileNotFoundError:
        return [], f"{path.name}: missing (pytest did not finish: see pytest.log)"
    except ET.ParseError as exc:
        return [], f"{path.name}: unreadable ({exc})"
    tests = []
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (node.get("message") or node.text or "").strip()
                break
        tests.append(
            {
                "test": name,
                "outcome": outcome,
                "seconds": round(float(case.get("time", 0) or 0), 2),
                "message": message[:1500],
            }
        )
    return tests, None


def build(out: Path, work: Path) -> dict[str, Any]:
    notes: list[str] = []
    probe, note = load_json(work / "probe.json")
    if note:
        notes.append(note)
    phases, note = load_lines(work / "phases.jsonl")
    if note:
        notes.append(note)
    tests, note = tests_from_junit(out / "junit.xml")
    if note:
        notes.append(note)
    figures, note = load_lines(out / "figures.jsonl")
    if note:
        notes.append(note)
    bench, note = load_json(out / "bench.json")
    if note:
        notes.append(note)
    counts: dict[str, int] = {}
    for t in tests:
        counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
    by_test = {f["test"]: f["figures"] for f in figures if isinstance(f, dict) and "test" in f}
    for t in tests:
        short = t["test"].split("::")[-1]
        for nodeid, figs in by_test.items():
            if nodeid.endswith("::" + short):
                t["figures"] = figs
    gpu_ok = bool(probe and probe.get("gpu_ok"))
    timed_out = [p["phase"] for p in phases if p.get("rc") in TIMEOUT_RCS]
    if not gpu_ok:
        verdict = "NO CUDA/GPU: " + str((probe or {}).get("problem", "the probe gave no answer"))
    elif not tests:
        verdict = "GPU present, but no test result (see notes and pytest.log)"
    elif counts.get("failed") or counts.get("error") or counts.get("skipped"):
        verdict = "GPU present: NOT all gpu tests passed"
    else:
        verdict = "GPU present: all gpu tests passed"
    return {
        "verdict": verdict,
        "gpu_ok": gpu_ok,
        "counts": counts,
        "timed_out_phases": timed_out,
        "phases": phases,
        "probe": probe,
        "tests": tests,
        "bench": bench,
        "notes": notes,
    }


def markdown(r: dict[str, Any]) -> str:
    c = r["counts"]
    lines = [
        "# trainguard GPU device run (issue 18)",
        "",
        f"**{r['verdict']}**",
        "",
        f"{c.get('passed', 0)} passed, {c.get('failed', 0)} failed, {c.get('error', 0)} errors, "
        f"{c.get('skipped', 0)} skipped",
    ]
    if r["timed_out_phases"]:
        lines += ["", f"Timed out: {', '.join(r['timed_out_phases'])}"]
    probe = r["probe"] or {}
    nvml, cuda = probe.get("nvml", {}), probe.get("cuda", {})
    lines += [
        "",
        "## Machine",
        "",
        f"- Python {probe.get('python')} ({probe.get('executable')}), "
        f"kernel {probe.get('kernel')}, {probe.get('cpus')} CPUs",
        f"- driver {nvml.get('driver')}; GPUs {json.dumps(nvml.get('gpus'))}",
        f"- torch {cuda.get('torch')} CUDA {cuda.get('cuda')}; "
        f"device 0 {json.dumps(cuda.get('device0'))}",
        f"- packages {json.dumps(probe.get('packages'))}",
    ]
    if probe.get("problem"):
        lines.append(f"- problem: {probe['problem']}")
    lines += ["", "## Phases", "", "| phase | rc | seconds | limit s |", "|---|---|---|---|"]
    for p in r["phases"]:
        lines.append(
            f"| {p.get('phase')} | {p.get('rc')} | {p.get('seconds')} | {p.get('limit')} |"
        )
    lines += ["", "## Tests", "", "| test | outcome | s | figures / message |", "|---|---|---|---|"]
    for t in r["tests"]:
        detail = json.dumps(t.get("figures")) if t.get("figures") else ""
        if t["outcome"] != "passed":
            detail = (detail + " " if detail else "") + t["message"].replace("\n", " ")[:600]
        detail = detail.replace("|", "\\|")
        lines.append(
            f"| {t['test'].split('::')[-1]} | {t['outcome']} | {t['seconds']} | {detail} |"
        )
    bench = r["bench"]
    lines += ["", "## Benchmark", ""]
    if not bench:
        lines.append("no bench.json")
    elif bench.get("skipped"):
        lines.append(f"skipped: {bench['skipped']}")
    else:
        lines += ["| NVML call | when | p50 µs | p99 µs | mean µs |", "|---|---|---|---|---|"]
        for name, v in bench.get("nvml_calls", {}).items():
            if isinstance(v, dict):
                lines.append(
                    f"| {name} | {v.get('when')} | {v.get('p50_us')} | {v.get('p99_us')} | "
                    f"{v.get('mean_us')} |"
                )
        lines += [
            "",
            "| exporter | p50 ms | p99 ms | CPU ms/scrape | idle CPU ms/s | RSS MiB | bytes |",
            "|---|---|---|---|---|---|---|",
        ]
        for kind, v in bench.get("scrape", {}).items():
            if "p50_ms" in v:
                lines.append(
                    f"| {kind} | {v['p50_ms']} | {v['p99_ms']} | {v['cpu_ms_per_scrape']} | "
                    f"{v.get('idle_cpu_ms_per_s')} | {v['rss_mib']} | {v['bytes']:.0f} |"
                )
            else:
                lines.append(f"| {kind} | {v.get('skipped') or v.get('error')} | | | | | |")
    if r["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in r["notes"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    out, work = Path(sys.argv[1]), Path(sys.argv[2])
    report = build(out, work)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report)
    (out / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
