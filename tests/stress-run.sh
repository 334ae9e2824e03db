#!/usr/bin/env bash
# The whole pytest suite, N times in a row, on a deliberately busy machine: two processes that
# burn a CPU each and one that keeps writing to the disk the tests use. A test that passes
# quietly but fails here waits for a fixed time, asserts a duration, or has a deadline too
# short for a machine 5-10x slower than usual; see tests/README.md.
#
#     tests/stress-run.sh [-n N] [N] [-- PYTEST ARGS...]
#
# Runs pytest directly with .venv's python, one worker per CPU as ./run-tests does (it installs
# nothing: run ./run-tests once first).
# Prints each run's pass/fail counts and wall time, stops the load on exit (whatever the
# cause), and exits non-zero if any run failed. Logs: $STRESS_LOG_DIR (default a new temp dir).
set -euo pipefail
cd "$(dirname "$0")/.."

runs=3
while (($#)); do
    case $1 in
    -n)
        runs=${2:?-n needs a number}
        shift 2
        ;;
    -n*)
        runs=${1#-n}
        shift
        ;;
    --)
        shift
        break
        ;;
    -h | --help)
        sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *)
        if [[ $1 =~ ^[0-9]+$ ]]; then
            runs=$1
            shift
        else
            break
        fi
        ;;
    esac
done
[[ $runs =~ ^[1-9][0-9]*$ ]] || {
    echo "stress-run: N must be a positive number, not '$runs'" >&2
    exit 2
}

py=.venv/bin/python
[[ -x $py ]] || {
    echo "stress-run: $py not found; run ./run-tests once first (it makes .venv)" >&2
    exit 2
}

logs=${STRESS_LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/trainguard-stress.XXXXXX")}
mkdir -p "$logs"
scratch=$(mktemp -d "${TMPDIR:-/tmp}/trainguard-stress-disk.XXXXXX")

load_pids=()
stop_load() {
    local pid
    for pid in "${load_pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${load_pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    load_pids=()
    rm -rf "$scratch"
}
trap stop_load EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# the load: two CPU burners and a writer that keeps the disk busy (300 MB files written,
# flushed and deleted in a loop, in the same temp dir the tests use)
for _ in 1 2; do
    "$py" -c 'while True: pass' &
    load_pids+=($!)
done
"$py" - "$scratch" <<'EOF' &
import os, sys
chunk = os.urandom(1 << 20)
path = os.path.join(sys.argv[1], "disk-load")
while True:
    with open(path, "wb") as f:
        for _ in range(300):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    os.unlink(path)
EOF
load_pids+=($!)

echo "stress-run: $runs run(s) of the whole suite under load (2 CPU burners, 1 disk writer;" \
    "pids ${load_pids[*]}); logs in $logs"

failed=0
for ((i = 1; i <= runs; i++)); do
    log=$logs/run-$i.log
    echo "stress-run: run $i/$runs started $(date +%H:%M:%S)"
    start=$(date +%s)
    rc=0
    "$py" -m pytest -p no:cacheprovider -q -n "${TRAINGUARD_TEST_WORKERS:-auto}" "$@" >"$log" 2>&1 || rc=$?
    secs=$(($(date +%s) - start))
    # pytest's last line: "3 failed, 250 passed, 4 skipped in 612.34s (0:10:12)" (with -q;
    # framed in "=" without)
    summary=$(grep -E '(passed|failed|errors?|skipped|deselected|no tests ran).* in [0-9.]+s' "$log" |
        tail -n 1 | sed -E 's/^=+ //; s/ in [0-9.]+s.*//' || true)
    printf 'stress-run: run %d/%d: %s: %s, %dm%02ds (log %s)\n' "$i" "$runs" \
        "$( ((rc == 0)) && echo PASS || echo FAIL)" "${summary:-no summary (rc $rc)}" \
        $((secs / 60)) $((secs % 60)) "$log"
    if ((rc != 0)); then
        failed=$((failed + 1))
        grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/    /' || true
    fi
done

if ((failed)); then
    echo "stress-run: $failed of $runs run(s) failed"
    exit 1
fi
echo "stress-run: all $runs run(s) passed"
