#!/usr/bin/env bash
# The GPU checks of issue 18 in one bounded run on the device machine (see tests/gpu/README.md
# for the exact `run` call):
#
#   OUT=DIR tests/gpu/run-on-device.sh [PYTEST_ARGS...]     e.g. -k "oom or ghost"
#
#   1. installs the carried wheels (.whl/, made here by tests/gpu/fetch-wheels.sh) that the
#      device's python3 lacks, into $TG_SITE (put on PYTHONPATH), and the carried promtool
#   2. probes the driver (nvidia-smi, NVML) and CUDA (torch)            -> run.log
#   3. runs tests/gpu with a per-test timeout                          -> pytest.log, junit.xml,
#                                                                         figures.jsonl
#   4. bench/bench_real_gpu.py: NVML µs per call, scrape cost vs nvitop -> bench.json
#   5. tests/gpu/report.py                                              -> report.json, report.md
#
# At most 7 files land in $OUT (the device returns 8). Each phase runs under `timeout`, inside
# a budget for the whole script (TG_BUDGET_S, default 450 s); a phase that fails or times out
# is recorded and the next one still runs. Without a GPU (no driver, or torch without CUDA) it
# still runs the tests (they skip), writes a report that says "NO CUDA/GPU" and exits 2.
# Exit status: 0 all gpu tests passed; 1 a test failed, errored or skipped, or a phase broke;
# 2 no GPU here.
#
# Knobs: PYTHON (python3), TG_WHEELS (.whl), TG_SITE (/tmp/tg-site), TG_BUDGET_S (450),
# TG_TEST_TIMEOUT (240 s per test), TG_BENCH (1; 0 skips the benchmark).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

START=$SECONDS
OUT=${OUT:-$PWD/gpu-report}
PY=${PYTHON:-python3}
WHEELS=${TG_WHEELS:-.whl}
SITE=${TG_SITE:-/tmp/tg-site}
BUDGET=${TG_BUDGET_S:-450}
TEST_TIMEOUT=${TG_TEST_TIMEOUT:-240}
BENCH=${TG_BENCH:-1}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tg-device.XXXXXX")
mkdir -p "$OUT"
: >"$OUT/run.log"
export PYTHONUNBUFFERED=1

log() { echo "run-on-device +$((SECONDS - START))s: $*" | tee -a "$OUT/run.log" >&2; }
left() { echo $((BUDGET - (SECONDS - START))); }
# phase NAME LIMIT STDOUT STDERR CMD...: run CMD under `timeout LIMIT` with its output appended
# to those files; record its status and duration in phases.jsonl
phase() {
    local name=$1 limit=$2 out=$3 err=$4 began=$SECONDS rc
    shift 4
    if ((limit < 5)); then
        log "$name: skipped, the budget is spent"
        record "$name" null 0 "$limit"
        return 99
    fi
    log "$name (at most ${limit}s)"
    timeout -k 10 "$limit" "$@" >>"$out" 2>>"$err"
    rc=$?
    record "$name" "$rc" $((SECONDS - began)) "$limit"
    if ((rc == 124 || rc == 137)); then log "$name: TIMED OUT after ${limit}s"; else log "$name: rc $rc"; fi
    return "$rc"
}
record() { echo "{\"phase\": \"$1\", \"rc\": $2, \"seconds\": $3, \"limit\": $4}" >>"$WORK/phases.jsonl"; }

# -- 1. carried wheels and promtool ------------------------------------------------------
install_carried() {
    local missing=() whl dist
    if [[ ! -d $WHEELS ]]; then
        log "no $WHEELS/: nothing carried (make it with tests/gpu/fetch-wheels.sh)"
        return 0
    fi
    for whl in "$WHEELS"/*.whl; do
        [[ -e $whl ]] || continue
        dist=$(basename "$whl")
        dist=${dist%%-*}
        dist=${dist//_/-}
        if "$PY" -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$dist" 2>/dev/null; then
            log "have $dist $("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$dist"), not installing $(basename "$whl")"
        else
            missing+=("$whl")
        fi
    done
    if ((${#missing[@]})); then
        log "installing into $SITE: ${missing[*]}"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" "${missing[@]}" 2>&1 | tee -a "$OUT/run.log" || return 1
    fi
    if ! command -v promtool >/dev/null && [[ -f $WHEELS/promtool.xz ]]; then
        mkdir -p "$SITE/bin"
        "$PY" -c 'import lzma, shutil, sys
with lzma.open(sys.argv[1]) as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)' "$WHEELS/promtool.xz" "$SITE/bin/promtool" || return 1
        chmod +x "$SITE/bin/promtool"
    fi
    return 0
}
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$SITE/bin:$PATH"
# not under `timeout` (a shell function): pip on local wheels and one decompression
began=$SECONDS
install_carried
rc=$?
record install "$rc" $((SECONDS - began)) null
log "install: rc $rc"
if command -v promtool >/dev/null; then
    if version=$(promtool --version 2>&1); then
        log "promtool: ${version%%$'\n'*}"
    else
        log "promtool: $(command -v promtool) does not run here: ${version:0:300}"
    fi
else
    log "promtool: MISSING (the ghost and join tests need it)"
fi

# -- 2. what is there -------------------------------------------------------------------------
if command -v nvidia-smi >/dev/null; then
    timeout 30 nvidia-smi >>"$OUT/run.log" 2>&1
    timeout 30 nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,memory.used \
        --format=csv >>"$OUT/run.log" 2>&1
else
    log "nvidia-smi: not on PATH"
fi
probe() {
    : >"$WORK/probe.json"
    phase probe "$(($(left) < 120 ? $(left) : 120))" "$WORK/probe.json" "$OUT/run.log" \
        "$PY" tests/gpu/probe.py
}
probe
if grep -q '"library_missing": true' "$WORK/probe.json" 2>/dev/null; then
    # NVML not on the loader's path: look where drivers put it, then ask again
    lib=$(ldconfig -p 2>/dev/null | awk '/libnvidia-ml\.so\.1 /{print $NF; exit}')
    for dir in ${lib:+"$(dirname "$lib")"} /usr/local/nvidia/lib64 /usr/local/nvidia/lib \
        /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/cuda/compat; do
        if [[ -e $dir/libnvidia-ml.so.1 ]]; then
            export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
            log "NVML found in $dir: LD_LIBRARY_PATH=$LD_LIBRARY_PATH; probing again"
            probe
            break
        fi
    done
fi
cat "$WORK/probe.json" >>"$OUT/run.log"
echo >>"$OUT/run.log"
gpu_ok=0
if grep -q '"gpu_ok": true' "$WORK/probe.json" 2>/dev/null; then
    gpu_ok=1
    log "GPU and CUDA found: skips count as failures (TRAINGUARD_GPU_REQUIRED=1)"
else
    log "NO CUDA/GPU here: the gpu tests will skip; nothing is measured on a GPU"
fi

# -- 3. the gpu tests -----------------------------------------------------------------------
timeout_opt=()
if "$PY" -c "import pytest_timeout" 2>/dev/null; then
    timeout_opt=("--timeout=$TEST_TIMEOUT")
else
    log "pytest-timeout missing: only the phase's own timeout bounds the tests"
fi
reserve=$((BENCH == 1 ? 130 : 30))
limit=$(($(left) - reserve))
((limit > 330)) && limit=330
export TRAINGUARD_GPU_REQUIRED=$gpu_ok TRAINGUARD_GPU_FIGURES="$OUT/figures.jsonl"
: >"$OUT/figures.jsonl"
phase pytest "$limit" "$OUT/pytest.log" "$OUT/pytest.log" \
    "$PY" -m pytest tests/gpu -p no:cacheprovider -rA -v \
    --junitxml="$OUT/junit.xml" "${timeout_opt[@]}" "$@"
tests_rc=$?
tail -n 25 "$OUT/pytest.log" >&2

# -- 4. the benchmark ---------------------------------------------------------------------------
bench_rc=0
if ((BENCH == 1)); then
    limit=$(($(left) - 30))
    ((limit > 120)) && limit=120
    phase bench "$limit" "$OUT/run.log" "$OUT/run.log" \
        "$PY" bench/bench_real_gpu.py --json "$OUT/bench.json"
    bench_rc=$?
fi

# -- 5. the report ----------------------------------------------------------------------------
timeout 30 "$PY" tests/gpu/report.py "$OUT" "$WORK"
report_rc=$?
log "done in $((SECONDS - START))s: tests rc $tests_rc, bench rc $bench_rc, report rc $report_rc"
rm -rf "$WORK"
if ((gpu_ok == 0)); then exit 2; fi
if ((tests_rc != 0 || bench_rc != 0 || report_rc != 0)); then exit 1; fi
exit 0
