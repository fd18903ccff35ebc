#!/usr/bin/env bash
# The test suite's sessions. The Makefile installs (the venvs, the Debian packages, the Charliecloud image)
# and then calls this script; tests/README.md says what each tier needs and how long a run takes.
#
#   tests/run.sh          the whole suite (make test): the lint, then four lines of sessions side by side,
#                         one exit code; a skip for other causes than this host's hardware fails it, unless
#                         BERT_SQUAD_REQUIRE_ALL=0 asks for a partial run
#   tests/run.sh fast     the lint, then the suite without the `slow` tests (everything that trains) and
#                         without the `transformers4` ones (the compat venv runs those): make test-fast
#   tests/run.sh compat   the compat tests in .venv-compat (make test-compat, which installs it first)
#   tests/run.sh lint     ruff (lint and format) and mypy, as pyproject.toml configures them: make lint
#
# VENV names the main venv (.venv); COMPAT_STACK the compat line's releases (its floors), for the summary
# (the Makefile passes both). pytest reads PYTEST_ADDOPTS in every session: PYTEST_ADDOPTS='-k NAME'
# tests/run.sh runs the whole orchestration over a few tests.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PY=$VENV/bin/python
COMPAT_STACK=${COMPAT_STACK:-every requirement at its floor}
# One thread a process: the lines run several processes a core, and torch's default of a thread per core has
# each process's threads spin on the others' (three copies of one training test side by side: 71 s with it,
# 61 s with one thread each).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# A process of more threads (the demo's session) waits at OpenMP's barriers asleep, not spinning: six 2-thread
# MiniLM steps beside four busy processes cost 40.8 s of CPU spinning and 21.7 s asleep, to the same weights
# (OpenMP's static schedule does not depend on how threads wait).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
# Which tests each session runs is tests/lines.py's: from the markers setup.cfg declares, each session's own,
# none twice (tests/test_lines.py). `session_args NAME` puts a session's pytest arguments into the array ARGS,
# which the caller declares local.
session_args() {
    local text
    text=$("$PY" tests/lines.py "$1")
    mapfile -t ARGS <<< "$text"
}
# The ports the session's tests listen on, a block of its own (tests/lines.py): sessions run side by side.
session_ports() {
    "$PY" tests/lines.py --ports "$1"
}

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
    local ARGS
    session_args compat
    BERT_SQUAD_TEST_PORTS=$(session_ports compat) .venv-compat/bin/python -m pytest -q -ra "${ARGS[@]}"
}

# A session of the main venv by its name in tests/lines.py: quiet, the ten slowest tests, the reasons of what did
# not pass; a background one (any but the rest) without pytest's cache, which sessions side by side would share.
# The demo's session is one training that ends the suite alone: two threads, one a core.
session() {
    local name=$1 ARGS cache=() threads=$OMP_NUM_THREADS
    session_args "$name"
    [[ $name == rest ]] || cache=(-p no:cacheprovider)
    [[ $name != demo ]] || threads=2
    BERT_SQUAD_TEST_PORTS=$(session_ports "$name") OMP_NUM_THREADS=$threads \
        "$PY" -m pytest -q -ra --durations=10 "${cache[@]}" "${ARGS[@]}"
}

# Two sessions one after the other, both always run: the training-heavy files then the benchmarks' own (the two
# sessions of CPU work beside the rest's), the multinode cluster then make demo's recipe (one training of minutes:
# started first, beside the other lines, its run took over 30 minutes).
two_sessions() {
    local rc=0
    session "$1" || rc=$?
    echo "--- $2:"
    session "$2" || rc=$?
    return "$rc"
}

# The single-node Slurm and the containers while the compat venv installs, then the compat tests in it. A
# failed install's last lines stand for the compat session's output.
single_node_then_compat() {
    local rc=0 install
    make -s compat-env > "$VENV/compat-install.log" 2>&1 &
    install=$!
    session single-node || rc=$?
    if wait "$install"; then
        echo "--- compat ($COMPAT_STACK):"
        compat || rc=$?
    else
        echo "--- compat ($COMPAT_STACK): the install failed"
        tail -20 "$VENV/compat-install.log"
        rc=1
    fi
    return "$rc"
}

# A line in the background: its output to $VENV/test-NAME.log, its exit code to $VENV/test-NAME.rc.
background() {
    local name=$1
    shift
    rm -f "$VENV/test-$name.rc"
    { local rc=0; "$@" > "$VENV/test-$name.log" 2>&1 || rc=$?; echo "$rc" > "$VENV/test-$name.rc"; } &
}

# Four lines side by side, every session always run, any one failing fails the run: the multinode cluster
# then the demo's recipe, the single-node Slurm and the containers then compat, the training-heavy files then bench,
# and the rest in the foreground. The cluster tiers spend much of their time waiting on Slurm (job starts, time limits, node
# timeouts, KillWait), and one session of training tests keeps at most one core busy while its ranks start, load
# and wait on each other: so the waits of two lines overlap the work of the others. The whole suite runs every
# tier: a test skipped for anything but this host's hardware (not root, a Debian package or ../shared missing)
# fails it, naming why (tests/conftest.py), unless the person asks for a partial run with
# BERT_SQUAD_REQUIRE_ALL=0 (CI runs every tier whatever it says).
whole_suite() {
    export BERT_SQUAD_REQUIRE_ALL=${BERT_SQUAD_REQUIRE_ALL:-1}
    lint
    local lines=(multinode-demo single-node-compat training-bench) rest=0 summary name
    echo "three lines run beside the rest (${lines[*]}); their output follows at the end (live: tail -f" \
         "$VENV/test-${lines[0]}.log and the like)"
    background "${lines[0]}" two_sessions multinode demo
    background "${lines[1]}" single_node_then_compat
    background "${lines[2]}" two_sessions training bench
    session rest || rest=$?
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
