#!/usr/bin/env bash
# Run a pytest selection while every core is kept busy by other processes, several times in a
# row, and count the runs that pass: a test that waits on the wrong thing (a signal that
# usually comes first, a fixed sleep) fails here long before it fails on a loaded CI machine.
#
#   scripts/test_under_load.sh [-n RUNS] [-s] [-b BUSY] [-t SECONDS] [PYTEST_ARGS...]
#
#   -n RUNS     how many runs in a row (default 3)
#   -s          shuffle each run's order (tests/conftest.py, CANDLEWICK_SHUFFLE_SEED); the
#               seeds are 1..RUNS after SEED (environment, default: a random one) and each
#               run prints its own, so a failing order can be run again with that seed
#   -b BUSY     how many busy loops compete (default: one per core, `nproc`)
#   -t SECONDS  a run that takes longer is stopped and counts as failed (default: no limit)
#
# Example: scripts/test_under_load.sh -n 5 -s tests/app/ui -m "not slow"
# Exit status: 0 when every run passed, 1 otherwise. The busy loops end with the script
# (Ctrl-C included).
set -u
cd "$(dirname "$0")/.."

RUNS=3 SHUFFLE=0 BUSY=$(nproc) LIMIT=0
while getopts "n:sb:t:h" opt; do
    case $opt in
        n) RUNS=$OPTARG ;;
        s) SHUFFLE=1 ;;
        b) BUSY=$OPTARG ;;
        t) LIMIT=$OPTARG ;;
        *) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
for n in "$RUNS" "$BUSY" "$LIMIT"; do
    [[ $n =~ ^[0-9]+$ ]] || { echo "not a whole number: $n" >&2; exit 2; }
done
PY=${PY:-.venv/bin/python}
[[ -x $PY ]] || { echo "no $PY: run make setup first" >&2; exit 2; }
SEED=${SEED:-$RANDOM}

busy_pids=()
stop_busy() {
    for pid in "${busy_pids[@]}"; do kill "$pid" 2>/dev/null; done
    wait "${busy_pids[@]}" 2>/dev/null
    busy_pids=()
}
trap stop_busy EXIT
trap 'exit 130' INT TERM  # the EXIT trap still stops the loops
for ((i = 0; i < BUSY; i++)); do
    yes >/dev/null &
    busy_pids+=($!)
done
echo "$BUSY busy loop(s) running beside: pytest $*"

passed=0 failed_runs=()
for ((run = 1; run <= RUNS; run++)); do
    env=(QT_QPA_PLATFORM=offscreen)
    label="run $run/$RUNS"
    if ((SHUFFLE)); then
        seed=$((SEED + run))
        env+=(CANDLEWICK_SHUFFLE_SEED=$seed)
        label+=" (seed $seed)"
    fi
    cmd=(env "${env[@]}" "$PY" -m pytest -q -p no:randomly "$@")
    ((LIMIT > 0)) && cmd=(timeout --kill-after=30 "$LIMIT" "${cmd[@]}")
    echo "== $label"
    start=$SECONDS
    "${cmd[@]}"
    rc=$?
    if ((rc == 0)); then
        passed=$((passed + 1))
        echo "== $label passed ($((SECONDS - start)) s)"
    else
        failed_runs+=("$label")
        ((rc == 124 || rc == 137)) && why="stopped after $LIMIT s" || why="exit $rc"
        echo "== $label FAILED: $why ($((SECONDS - start)) s)"
    fi
done

echo "passed $passed of $RUNS runs under load ($BUSY busy loops)"
for r in "${failed_runs[@]}"; do echo "failed: $r"; done
((passed == RUNS))
