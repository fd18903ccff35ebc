"""The CLI runs that the tests fork from a preloaded server (tests/preloaded.py), against the fresh interpreters
they stand for: which runs are forked, and that a forked run prints, exits and trains as a fresh one."""

import os
import subprocess

import preloaded
import pytest
from helpers import PYTHON, ROOT, Started, assert_same_weights, train_args

CLI = [PYTHON, "-m", "bert_squad"]


def test_only_runs_a_fresh_interpreter_would_start_alike_are_forked(tmp_path):
    # No test before this one in its session left a variable changed that a library reads at import (every later
    # run would start fresh): here, late in its session, a run with this process's environment still forks.
    assert not preloaded.read_at_import_differ(dict(os.environ, PYTHONUNBUFFERED="1"))
    session = dict(preloaded.SESSION_ENV)
    assert preloaded.can_fork([*CLI, "--help"], session, ROOT)
    # A rank's variables are read when the command runs.
    assert preloaded.can_fork([*CLI, "evaluate"], {**session, "RANK": "1", "MASTER_PORT": "29999"}, ROOT)
    # `-m` would import a bert_squad from the working directory first.
    assert not preloaded.can_fork([*CLI, "--help"], session, tmp_path)
    # The Hugging Face libraries read HF_HOME at import, the interpreter PYTHONUNBUFFERED as it starts: the
    # forkserver started and imported them with the session's.
    assert not preloaded.can_fork([*CLI, "--help"], {**session, "HF_HOME": str(tmp_path)}, ROOT)
    unbuffered = {k: v for k, v in session.items() if k != "PYTHONUNBUFFERED"}
    assert not preloaded.can_fork([*CLI, "--help"], unbuffered, ROOT)
    # The one command that goes online, by its word and its alias.
    assert not preloaded.can_fork([*CLI, "download", "--model", "bert-base-uncased"], session, ROOT)
    assert not preloaded.can_fork([*CLI, "--download-only"], session, ROOT)
    # The tap scripts run the CLI with a hook; other scripts start fresh.
    assert preloaded.can_fork([PYTHON, str(ROOT / "tests" / "state_tap.py"), str(tmp_path)], session, ROOT)
    assert not preloaded.can_fork([PYTHON, "bench/throughput.py"], session, ROOT)


def _run(args, folder):
    """(how it was started, exit code, stdout, stderr) of the CLI run with `args`."""
    with Started([*CLI, *map(str, args)], folder) as run:
        code = run.wait(300)
        return type(run.proc), code, run.stdout, run.stderr


@pytest.mark.slow
def test_a_forked_run_prints_exits_and_trains_as_a_fresh_one(tiny_model, sample_train, tmp_path, monkeypatch):
    """The same bad input gives the same one line and exit code, and the same training the same weights, bit for
    bit, whether the run is forked or a fresh interpreter (BERT_SQUAD_TESTS_FRESH=1)."""
    runs = {}
    for how in ("forked", "fresh"):
        if how == "fresh":
            monkeypatch.setenv("BERT_SQUAD_TESTS_FRESH", "1")
        missing = _run(["--model", tiny_model, "--train-file", tmp_path / "missing.json"], tmp_path / how / "bad")
        steps = ["--no-eval", "--learning-rate", "1e-3", "--max-steps", "3"]
        trained = _run(train_args(tiny_model, sample_train, tmp_path / how / "out", *steps), tmp_path / how / "logs")
        runs[how] = missing, trained
    forked, fresh = runs["forked"], runs["fresh"]
    assert forked[0][0] is forked[1][0] is preloaded.Forked and fresh[0][0] is fresh[1][0] is subprocess.Popen
    assert forked[0][1:] == fresh[0][1:] and forked[0][1] == 2 and "missing.json" in forked[0][3], forked[0]
    assert forked[1][1] == fresh[1][1] == 0, (forked[1][3][-2000:], fresh[1][3][-2000:])
    assert "Traceback" not in forked[1][3] + fresh[1][3]
    assert_same_weights(tmp_path / "forked" / "out", tmp_path / "fresh" / "out")
