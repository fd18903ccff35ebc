#!/usr/bin/env bash
# The test suite's sessions. The Makefile installs (the venvs, the Debian packages, the Charliecloud image)
# and then calls this script; tests/README.md says what each tier needs and how long a run takes.
#
#   tests/run.sh          the whole suite (make test): the lint, then four lines of sessions side by side, one exit code
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
# KillWait): a session of their own, beside the sessions that keep the cores busy.
CLUSTER_TIERS="slurm or multinode or container"
# Every session of the main venv but the cluster tiers' leaves out what the others run.
ELSEWHERE="$CLUSTER_TIERS or bench or transformers4"
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

# The files whose tests train the most (every encoder family, every config's resume on other worlds, the span
# head everywhere): a session of their own, since one session keeps at most one core busy while its ranks
# start, load and wait on each other.
TRAINING_FILES=(tests/test_families.py tests/test_resume_anywhere.py tests/test_span_head.py)

# The compat venv installs, its tests run in it, then the benchmarks' own tests (bench) in the main venv; both
# sessions always run. A failed install's last lines stand for the compat session's output.
compat_then_bench() {
    local rc=0
    if make -s compat-env > "$VENV/compat-install.log" 2>&1; then
        echo "--- compat ($COMPAT_TRANSFORMERS):"
        compat || rc=$?
    else
        echo "--- compat ($COMPAT_TRANSFORMERS): the install failed"
        tail -20 "$VENV/compat-install.log"
        rc=1
    fi
    echo "--- bench:"
    "$PY" -m pytest -q -ra --durations=10 -p no:cacheprovider -m bench || rc=$?
    return "$rc"
}

# One line of sessions in the background: its output to $VENV/test-NAME.log, its exit code to $VENV/test-NAME.rc.
background() {
    local name=$1
    shift
    rm -f "$VENV/test-$name.rc"
    { local rc=0; "$@" > "$VENV/test-$name.log" 2>&1 || rc=$?; echo "$rc" > "$VENV/test-$name.rc"; } &
}

# Four lines side by side, each always run, any one failing fails the run: the cluster tiers (mostly waiting
# on Slurm), compat then bench, the training-heavy files, and the rest in the foreground.
whole_suite() {
    lint
    local lines=(clusters compat-bench training) rest=0 summary name
    echo "the cluster tiers, compat then bench, and the training-heavy files run beside the rest; their output" \
         "follows at the end (live: tail -f $VENV/test-clusters.log and the like)"
    background clusters "$PY" -m pytest -q -ra --durations=10 -p no:cacheprovider -m "$CLUSTER_TIERS"
    background compat-bench compat_then_bench
    background training "$PY" -m pytest -q -ra --durations=10 -p no:cacheprovider -m "not ($ELSEWHERE)" \
        "${TRAINING_FILES[@]}"
    "$PY" -m pytest -q -ra --durations=10 -m "not ($ELSEWHERE)" "${TRAINING_FILES[@]/#/--ignore=}" || rest=$?
    wait
    summary="rest: exit $rest"
    for name in "${lines[@]}"; do
        echo "--- $name:"
        cat "$VENV/test-$name.log" || true
        # "none": the line ended before it could write its exit code.
        summary+=", $name: exit $(cat "$VENV/test-$name.rc" 2>/dev/null || echo none)"
    done
    echo "$summary"
    [[ "$summary" != *"exit "[!0]* ]]
}

case "${1:-all}" in
    all) whole_suite ;;
    fast) fast ;;
    compat) compat ;;
    lint) lint ;;
    *) echo "usage: tests/run.sh [all|fast|compat|lint]" >&2; exit 2 ;;
esac
