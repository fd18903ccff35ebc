"""The CLI runs that the tests fork from preloaded servers (tests/preloaded.py), against the fresh interpreters
they stand for: which runs are forked, and that a forked run prints, exits and trains as a fresh one."""

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import preloaded
import pytest
from helpers import PYTHON, ROOT, Started, assert_same_weights, rank_env, train_args

CLI = [PYTHON, "-m", "bert_squad"]


def test_only_runs_a_fresh_interpreter_would_start_alike_are_forked(tmp_path, monkeypatch):
    # No test before this one in its session left a variable changed that a library reads at import (every later
    # run would start fresh): here, late in its session, a run with this process's environment still forks.
    assert not preloaded.read_at_import_differ(dict(os.environ, PYTHONUNBUFFERED="1"))
    session = dict(preloaded.SESSION_ENV)
    assert preloaded.can_fork([*CLI, "--help"], session, ROOT)
    # A rank's variables are read when the command runs; ranks 0 and 1 fork, each from its own server.
    for rank in (0, 1):
        assert preloaded.can_fork([*CLI, "evaluate"], {**session, **rank_env(rank, 2, 29999)}, ROOT)
    for rank in ("2", "one"):
        assert not preloaded.can_fork([*CLI, "evaluate"], {**session, "RANK": rank, "WORLD_SIZE": "3"}, ROOT)
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
    # What a run prints at import its assertions read: the servers printed nothing as they imported, so a forked
    # run's output is all a fresh one's; a server that printed there forks no run.
    assert [preloaded.import_output(rank) for rank in (0, 1)] == ["", ""]
    monkeypatch.setattr(preloaded, "import_output", lambda rank: "a warning at import\n")
    assert not preloaded.can_fork([*CLI, "--help"], session, ROOT)


def test_no_run_forks_where_a_gpu_is_visible(monkeypatch):
    """The servers' imports ask torch whether CUDA is there (DeepSpeed's accelerator), which on a GPU initialises
    the driver in them: a forked child could not use CUDA again. A session that sees a GPU records no
    environment to fork with; one that sees none does. And the session's servers never initialised CUDA: a
    process forked from either could."""
    for gpus, forks in ((1, False), (0, True)):
        monkeypatch.setattr(preloaded, "SESSION_ENV", {})
        preloaded.session_started(gpus)
        assert preloaded.can_fork([*CLI, "--help"], dict(os.environ, PYTHONUNBUFFERED="1"), ROOT) is forks
    for rank in (0, 1):
        assert preloaded.cuda_untouched(rank)


def _forked(args, env, folder):
    """`python *args` forked with `env` (preloaded.start) to its end, its output in `folder`: (exit code, stdout,
    stderr)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("stdout", "stderr"):
        (folder / name).write_text("")
    code = preloaded.start(list(map(str, args)), env, folder / "stdout", folder / "stderr").wait(120)
    return code, (folder / "stdout").read_text(), (folder / "stderr").read_text()


# Says its hash secret (by a string's hash), as ranks that iterate over a set of strings would order it.
HASH = "print(hash('bert-squad'))\n"


def test_two_ranks_of_one_run_hash_apart_as_a_launchers_do(tmp_path):
    """Ranks a launcher starts each draw a hash secret of their own (PYTHONHASHSEED unset), so a set's or a
    dict's order that differs between ranks shows: ranks 0 and 1 of a run forked by hand do too, each from its
    own server; and rank 0 of two runs share theirs, as two forks of one server."""
    script = tmp_path / "hash.py"
    script.write_text(HASH)
    said = [
        _forked([script], {**preloaded.SESSION_ENV, **rank_env(rank, 2, 29999)}, tmp_path / f"{i}-rank{rank}")
        for i, rank in enumerate((0, 1, 0))
    ]
    assert [code for code, *_ in said] == [0] * 3 and said[0][1] != said[1][1] and said[0] == said[2], said


# How a script ends, by its first argument, after it left what only the interpreter's end writes: a thread still
# at work, an atexit handler, a file written and never closed, an object whose finaliser prints.
ENDINGS = r"""
import atexit, sys, threading, time
ending, folder = sys.argv[1], sys.argv[2]
threading.Thread(target=lambda: (time.sleep(0.5), print("thread done", flush=True))).start()
atexit.register(print, "atexit ran")
kept = open(f"{folder}/kept.txt", "w")
kept.write("written, never closed")
class Finalised:
    def __del__(self):
        print("finalised")
still = Finalised()
if ending == "exit 3":
    sys.exit(3)
if ending == "exit text":
    sys.exit("stopped: a reason")
if ending == "error":
    raise ValueError("an error")
if ending == "interrupt":
    raise KeyboardInterrupt
"""


@pytest.mark.parametrize("ending", ["returns", "exit 3", "exit text", "error", "interrupt"])
def test_a_forked_run_ends_as_the_interpreter_ends(tmp_path, ending):
    """The same script, forked and fresh: the same exit code (a SystemExit's, 1 with the traceback of the run's
    own frames for an error, death by SIGINT for a KeyboardInterrupt) and the same stdout, stderr and files.
    After the threads and atexit handlers, the interpreter's finalization frees every object (the open file
    flushed, the finaliser run): forked too, except after a KeyboardInterrupt, which ends the forked run by
    SIGINT before that (the difference, asserted)."""
    script = tmp_path / "ending.py"
    script.write_text(ENDINGS)
    seen = {}
    for how in ("forked", "fresh"):
        folder = tmp_path / how
        folder.mkdir()
        args = [script, ending, folder]
        if how == "forked":
            run = _forked(args, dict(preloaded.SESSION_ENV), folder)
        else:
            done = subprocess.run(
                [PYTHON, *args], capture_output=True, text=True, env=preloaded.SESSION_ENV, timeout=300
            )
            run = done.returncode, done.stdout, done.stderr
        code, *printed = run
        seen[how] = code, *(text.replace(str(folder), "FOLDER") for text in printed), (folder / "kept.txt").read_text()
    expected = {"returns": 0, "exit 3": 3, "exit text": 1, "error": 1, "interrupt": -signal.SIGINT}[ending]
    assert seen["fresh"][0] == expected and "thread done" in seen["fresh"][1], seen
    if ending == "interrupt":  # forked: neither the finaliser's line nor the unclosed file's text
        forked, fresh = seen["forked"], seen["fresh"]
        assert "finalised\n" in fresh[1] and fresh[3] == "written, never closed", seen
        assert forked == (fresh[0], fresh[1].replace("finalised\n", ""), fresh[2], ""), seen
    else:
        assert seen["forked"] == seen["fresh"], seen


def test_a_server_restarted_after_it_died_takes_the_sessions_environment(tmp_path, monkeypatch):
    """A test that changed this process's environment and then runs a forked CLI after the server died (killed,
    or out of memory) gets a server started with the session's environment, not its own."""
    preloaded.import_output(1)  # started
    dead = preloaded.server_pid(1)
    os.kill(dead, signal.SIGKILL)
    # Until every thread of it has ended (its first one's end alone is not its end): left for its parent to reap.
    while not os.waitid(os.P_PID, dead, os.WEXITED | os.WNOHANG | os.WNOWAIT):
        time.sleep(0.01)
    monkeypatch.setenv("BERT_SQUAD_TEST_OWN", "the test's")  # a run-time variable: the run still forks
    with Started([*CLI, "--help"], tmp_path, env=rank_env(1, 2, 29999)) as run:
        assert run.wait(120) == 0 and type(run.proc) is preloaded.Forked, run.seen()
    started_with = Path(f"/proc/{preloaded.server_pid(1)}/environ").read_bytes().split(b"\0")
    environ = dict(entry.decode().split("=", 1) for entry in started_with if entry)
    assert environ.pop("PYTHONPATH").split(os.pathsep)[0] == preloaded.PREPARE
    assert environ == {k: v for k, v in preloaded.SESSION_ENV.items() if k != "PYTHONPATH"}
    assert preloaded.server_pid(1) != dead


def _run(args, folder):
    """(how it was started, exit code, stdout, stderr) of the CLI run with `args`."""
    with Started([*CLI, *map(str, args)], folder) as run:
        code = run.wait(300)
        return type(run.proc), code, run.stdout, run.stderr


# What two runs of one training measure apart, each replaced by its name: the process id, the free port the run
# took, the throughput, the peak memory (a fork's counts the pages it shares with its server) and the seconds.
MEASURED = [
    (r"pid \d+", "pid PID"),
    (r"127\.0\.0\.1:\d+", "127.0.0.1:PORT"),
    (r"[\d.]+ (samples/s|tok/s|TFLOP/s/dev)", r"RATE \1"),
    (r"peak mem [\d.]+GiB", "peak mem MEMORY"),
    (r"\[[\d.]+s\]|\(\d+s\)", "SECONDS"),
]


def _measured_apart(text, folder):
    """`text` with what must differ between two runs in `folder` replaced by its name, the folder by FOLDER."""
    text = text.replace(str(folder), "FOLDER")
    for pattern, name in MEASURED:
        text = re.sub(pattern, name, text)
    return text


@pytest.mark.slow
def test_a_forked_run_prints_exits_and_trains_as_a_fresh_one(tiny_model, sample_train, tmp_path, monkeypatch):
    """The same bad input and the same training, forked and as a fresh interpreter (BERT_SQUAD_TESTS_FRESH=1):
    the same exit codes, the same stdout and stderr, whole, but for what two runs measure apart (`MEASURED`),
    and the same weights, bit for bit."""
    runs = {}
    for how in ("forked", "fresh"):
        if how == "fresh":
            monkeypatch.setenv("BERT_SQUAD_TESTS_FRESH", "1")
        missing = _run(["--model", tiny_model, "--train-file", tmp_path / "missing.json"], tmp_path / how / "bad")
        # A named config: a precision left to the CPU is timed, and two timings near 1x could fall apart
        steps = ["--no-eval", "--learning-rate", "1e-3", "--max-steps", "3", "--deepspeed-config", "ds_fp32"]
        trained = _run(train_args(tiny_model, sample_train, tmp_path / how / "out", *steps), tmp_path / how / "logs")
        runs[how] = [
            (started, code, *(_measured_apart(t, tmp_path / how) for t in out))
            for started, code, *out in (missing, trained)
        ]
    forked, fresh = runs["forked"], runs["fresh"]
    assert [r[0] for r in forked] == [preloaded.Forked] * 2 and [r[0] for r in fresh] == [subprocess.Popen] * 2
    assert [r[1:] for r in forked] == [r[1:] for r in fresh], (forked, fresh)
    assert forked[0][1] == 2 and forked[0][3].count("\n") == 1 and "missing.json" in forked[0][3], forked[0]
    assert forked[1][1] == 0 and forked[1][3] == "" and "step 3/3 loss" in forked[1][2], forked[1]
    assert_same_weights(tmp_path / "forked" / "out", tmp_path / "fresh" / "out")
