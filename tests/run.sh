#!/usr/bin/env bash
# The test suite's sessions. The Makefile installs (the venvs, the Debian packages, the Charliecloud image)
# and then calls this script; tests/README.md says what each tier needs and how long a run takes.
#
#   tests/run.sh          the whole suite (make test): the lint, then three sessions, one exit code
#   tests/run.sh fast     the lint, then the suite without the `slow` tests (everything that trains) and
#                         without the `transformers4` ones (the compat venv runs those): make test-fast
#   tests/run.sh compat   the compat tests in .venv-compat (make test-compat, which installs it first)
#   tests/run.sh lint     ruff (lint and format) and mypy, as pyproject.toml configures them: make lint
#
# VENV names the main venv (.venv); COMPAT_TRANSFORMERS the compat line's transformers, for the summary
# (the Makefile passes both). pytest reads PYTEST_ADDOPTS in every session: PYTEST_ADDOPTS='-k NAME'
# tests/run.sh runs the whole orchestration over a few tests.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PY=$VENV/bin/python
COMPAT_TRANSFORMERS=${COMPAT_TRANSFORMERS:-the oldest supported transformers}
# The cluster tiers spend much of their time waiting on Slurm (job starts, time limits, node timeouts,
# KillWait), the rest is CPU: the benchmarks' own tests (bench) run with them, CPU work in Slurm's waits.
CLUSTER_TIERS="slurm or multinode or container or bench"
# What the oldest line must do (the tests marked compat there): train on 1 and 2 ranks, evaluate, export,
# answer, load and label every encoder family it has, and refuse the ones newer than it naming the release
# they need; and its venv must be the pinned one.
COMPAT_TESTS=(tests/test_train.py tests/test_evaluate.py tests/test_answer.py tests/test_families.py
              tests/test_pins.py)
# The tests whose oracle only transformers 4.x has (the SQuAD v2.0 scorer): run there, left out of the main venv.
ORACLE_4X_TESTS=(tests/test_metrics.py tests/test_score_cli.py)

# Seconds, so it runs first: a lint failure ends the run before half an hour of tests.
lint() {
    "$VENV/bin/ruff" check .
    "$VENV/bin/ruff" format --check .
    "$VENV/bin/mypy"
}

fast() {
    lint
    "$PY" -m pytest -q -ra -m "not (slow or transformers4)"
}

compat() {
    .venv-compat/bin/python -m pytest -q -ra -m "compat or transformers4" "${COMPAT_TESTS[@]}" "${ORACLE_4X_TESTS[@]}"
}

# The background line: the compat venv installs while the cluster tiers run, then the compat tests run in
# it. Each session's output goes to a log and its exit code to a file, read at the end.
cluster_tiers_then_compat() {
    make -s compat-env > "$VENV/compat-install.log" 2>&1 &
    local install=$! tiers=0 compat_rc=0
    "$PY" -m pytest -q -ra --durations=10 -p no:cacheprovider -m "$CLUSTER_TIERS" > "$VENV/test-clusters.log" 2>&1 \
        || tiers=$?
    echo "$tiers" > "$VENV/test-clusters.rc"
    if wait "$install"; then
        compat > "$VENV/test-compat.log" 2>&1 || compat_rc=$?
        echo "$compat_rc" > "$VENV/test-compat.rc"
    else  # the install's last lines stand for the compat session's output
        tail -20 "$VENV/compat-install.log" > "$VENV/test-compat.log"
        echo 1 > "$VENV/test-compat.rc"
    fi
}

# Two pytest sessions side by side: the rest here, the cluster tiers and then compat in the background.
# Every session always runs, and any one failing fails the run.
whole_suite() {
    lint
    echo "cluster tiers, then compat, running beside the rest; their output follows at the end" \
         "(live: tail -f $VENV/test-clusters.log)"
    rm -f "$VENV/test-clusters.rc" "$VENV/test-compat.rc"
    cluster_tiers_then_compat &
    local side=$! rest=0 tiers compat_rc
    "$PY" -m pytest -q -ra --durations=10 -m "not ($CLUSTER_TIERS or transformers4)" || rest=$?
    wait "$side" || true
    echo "--- cluster tiers ($CLUSTER_TIERS):"
    cat "$VENV/test-clusters.log" || true
    echo "--- compat ($COMPAT_TRANSFORMERS):"
    cat "$VENV/test-compat.log" || true
    # "none": the background line ended before it could write that session's exit code.
    tiers=$(cat "$VENV/test-clusters.rc" 2>/dev/null || echo none)
    compat_rc=$(cat "$VENV/test-compat.rc" 2>/dev/null || echo none)
    echo "rest: exit $rest, cluster tiers: exit $tiers, compat: exit $compat_rc"
    [ "$rest" = 0 ] && [ "$compat_rc" = 0 ] && [ "$tiers" = 0 ]
}

case "${1:-all}" in
    all) whole_suite ;;
    fast) fast ;;
    compat) compat ;;
    lint) lint ;;
    *) echo "usage: tests/run.sh [all|fast|compat|lint]" >&2; exit 2 ;;
esac
