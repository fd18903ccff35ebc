"""Command-line fuzz: random options, values and small files over every command end in exit 0, 2 or 75,
never a traceback, and never leave a half-written output dir.

Options come from each command's own argparse parser (the first one it builds), so a new command
in cli.COMMANDS or a new option is fuzzed without touching this file. Accepted input runs for real: the
training and evaluation entries start the real process group (gloo, one rank) and train a step or
evaluate a few questions; a few more runs do the same in their own process. Never drawn: `download` and --submit (a
submission is tested against the real test Slurm in test_launch.py/test_sweep.py), --download-only (the
network; tested against a local hub in test_download.py), --debug (prints tracebacks on purpose),
--compile (minutes of compilation per example; tested in test_train.py).
"""

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from helpers import PYTHON, ROOT, train_args
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bert_squad import cli

NEVER = {"--submit", "--download-only", "--debug", "--compile", "--help", "-h"}
TEMP_MARKS = (".tmp", ".export-", ".write-test-", ".universal-")


class Captured(Exception):
    def __init__(self, parser):
        self.parser = parser


def parser_of(action, argv):
    """The first parser `action(argv)` parses with."""

    def capture(self, *args, **kwargs):
        raise Captured(self)

    saved = argparse.ArgumentParser.parse_known_args
    argparse.ArgumentParser.parse_known_args = capture
    try:
        action(argv)
    except Captured as got:
        return got.parser
    finally:
        argparse.ArgumentParser.parse_known_args = saved
    raise AssertionError(f"{action} parsed no arguments")


COMMANDS = [*(name for name in cli.COMMANDS if name != "download"), "bert-squad-test"]


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_model, sample_dev):
    d = tmp_path_factory.mktemp("fuzz-files")
    # A copy: a drawn --output-dir may name the model, and a run writes its own model there; the session's
    # tiny model, which other tests read, stays as it was built.
    model = shutil.copytree(tiny_model, d / "model")
    dev = json.loads(sample_dev.read_text())
    para = dev["data"][0]["paragraphs"][0]
    small = {"version": "1.1", "data": [{"title": "t", "paragraphs": [dict(para, qas=para["qas"][:3])]}]}
    contents = {
        "empty.json": "",
        "malformed.json": '{"data": [',
        "list.json": "[1, 2]",
        "small.json": json.dumps(small),
        "wrong.json": json.dumps(
            {"data": [{"paragraphs": [{"context": "x", "qas": [{"id": "a", "question": " ", "answers": []}]}]}]}
        ),
        "preds.json": json.dumps({qa["id"]: "x" for qa in small["data"][0]["paragraphs"][0]["qas"]}),
        "ds.json": json.dumps({"train_micro_batch_size_per_gpu": 2, "optimizer": "AdamW"}),
        "ds_typo.json": json.dumps({"train_micro_batch_size_per_gpu": 2, "zero_optimisation": {"stage": 3}}),
        "sweep.json": json.dumps({"combinations": "x"}),
    }
    for name, text in contents.items():
        (d / name).write_text(text)
    (d / "sweep").mkdir()
    (d / "sweep" / "sweep.json").write_text(json.dumps({"name": "s", "train_args": [], "combinations": []}))
    paths = [str(d / n) for n in contents] + [str(d), str(d / "missing.json"), str(model), str(d / "sweep")]
    base = {  # enough for a command to get past its required options, so the drawn ones are reached
        "train": train_args(model, d / "small.json", "out", "--max-steps", 1, cache=d / "cache", windows=[]),
        "evaluate": [
            "--model-dir",
            str(model),
            "--eval-file",
            str(d / "small.json"),
            "--output-dir",
            "out",
            "--cache-dir",
            str(d / "cache"),
        ],
        "predict": [
            "--model-dir",
            str(model),
            "--input",
            str(d / "small.json"),
            "--output-dir",
            "out",
            "--cache-dir",
            str(d / "cache"),
        ],
        "score": ["--eval-file", str(d / "small.json"), "--predictions", str(d / "preds.json")],
        "check-cache": ["--model", str(model)],
        "answer": ["--model-dir", str(model), "--question", "Who wrote it?", "--context", "Ada wrote it."],
        "export": ["--checkpoint", str(d), "--output-dir", "out"],
        "launch": ["--site", "generic"],
        "sweep": ["--site", "generic", "--seeds", "1", "--runs-dir", "runs"],
        "summarize": [str(d / "sweep")],
        "bert-squad-test": [
            "--model-file",
            str(model),
            "--eval-file",
            str(d / "small.json"),
            "--num-test-samples",
            "2",
            "--json",
        ],
        "sweep run": [str(d / "sweep"), "--index", "0"],
    }
    base["config"], base["test"] = base["train"], base["bert-squad-test"]
    return paths, base


def entry(name):
    if name == "train":
        return lambda argv: cli.main(argv)
    if name == "bert-squad-test":
        return cli.bert_squad_test
    return lambda argv: cli.main([*name.split(), *argv])


def test_an_option_commands_share_is_declared_once():
    """--debug in every command's parser, and --cache-dir, --lang and --model-dir in each that takes them, with
    one help text each: one declaration, not one per command."""
    helps, with_debug = {}, []
    for name in COMMANDS:
        parser = parser_of(entry(name), [])
        for action in parser._actions:
            for flag in set(action.option_strings) & {"--debug", "--cache-dir", "--lang", "--model-dir"}:
                helps.setdefault(flag, set()).add(action.help)
        with_debug += [name for a in parser._actions if "--debug" in a.option_strings]
    assert with_debug == COMMANDS
    assert set(helps) == {"--debug", "--cache-dir", "--lang", "--model-dir"}
    assert all(len(texts) == 1 for texts in helps.values()), helps


def test_every_option_has_help_that_shows_its_default(monkeypatch):
    """Every option of every command says what it is, and its default where it has one, in argparse's own
    words: `bert-squad --help` names the model a run takes without --model."""
    monkeypatch.setenv("COLUMNS", "1000")  # an option's help on one line
    for name in [*cli.COMMANDS, "bert-squad-test"]:
        parser = parser_of(entry(name), [])
        lines = parser.format_help().splitlines()
        for action in parser._actions:
            if action.help == argparse.SUPPRESS:
                continue
            assert action.help, f"{name}: {action.option_strings or action.dest} has no help"
            line = next(line for line in lines if action.help in line)
            shown = action.default not in (None, [], argparse.SUPPRESS) and action.default is not False
            assert (f"(default: {action.default})" in line) == shown, f"{name}: {line}"
    training = parser_of(entry("train"), []).format_help()
    assert "hub name (from the cache) or local model directory (default: bert-base-uncased)" in training


@pytest.mark.parametrize("name", ["config", "download", "check-cache"])
def test_the_commands_on_training_arguments_have_their_own_help(name, capsys):
    """`config`, `download` and `check-cache` take a training run's options, under their own usage and
    description."""
    texts = {}
    for words in ([], [name]):
        with pytest.raises(SystemExit) as stop:
            cli.main([*words, "--help"])
        assert stop.value.code == 0
        texts[tuple(words)] = capsys.readouterr().out
    own, training = texts[(name,)], texts[()]
    assert own.startswith(f"usage: bert-squad {name} [-h]") and training.startswith("usage: bert-squad [-h]")
    description = own.split("\n\n")[1]
    assert description not in training and "--max-seq-length MAX_SEQ_LENGTH" in own


def argv_strategy(parser, paths):
    values = st.sampled_from(
        [
            "",
            "0",
            "1",
            "-1",
            "3",
            "1e-3",
            "-0.5",
            "nan",
            "x",
            "auto",
            "ds_fp32",
            "1-2",
            "a=b",
            "learning_rate=1e-3,2e-3",
            "squad_v2",
            "cuda",
        ]
    ) | st.sampled_from(paths)
    options = [a for a in parser._actions if a.option_strings and not set(a.option_strings) & NEVER]
    positional = [a for a in parser._actions if not a.option_strings]

    @st.composite
    def draw(draw):
        argv = []
        for action in draw(st.lists(st.sampled_from(options), max_size=4)) if options else []:
            argv.append(draw(st.sampled_from(action.option_strings)))
            if action.nargs != 0:
                argv.append(draw(values))
        if positional and draw(st.booleans()):
            argv.append(draw(values))
        return argv

    return draw()


def check_outcome(code, output, workdir, argv):
    assert code in (0, 2, 75), f"exit {code} for {argv}:\n{output[-3000:]}"
    assert "Traceback" not in output, f"{argv}:\n{output[-3000:]}"
    for path in Path(workdir).rglob("*"):
        assert not any(mark in path.name for mark in TEMP_MARKS), f"{path} left by {argv}"
    out = Path(workdir) / "out"
    if out.is_dir() and not (out / "train_metrics.json").exists():
        assert not (out / "model.safetensors").exists(), f"half-written {out} after {argv}"


@contextlib.contextmanager
def isolated(workdir):
    """Run a command in `workdir` as a fresh process would: the process group's RANK/MASTER_PORT and the
    offline switches it sets in os.environ are undone afterwards, so they cannot leak into later examples
    or tests (a later mpirun would take a stale RANK for its own)."""
    environ, cwd = dict(os.environ), os.getcwd()
    os.chdir(workdir)
    try:
        yield
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environ)


@pytest.mark.slow
@pytest.mark.parametrize("name", COMMANDS)
def test_fuzz_in_process(name, files, tmp_path):
    """Every command in this process: accepted input trains or evaluates for real (tiny model, a step)."""
    paths, base = files
    parser = parser_of(entry(name), base[name])

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(drawn=argv_strategy(parser, paths))
    def run(drawn):
        workdir = Path(tempfile.mkdtemp(prefix="w", dir=tmp_path))  # one per example: drawn values repeat
        argv = [*base[name], *drawn]
        output = io.StringIO()
        with isolated(workdir), contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            try:
                code = entry(name)(argv)
            except SystemExit as stop:  # argparse: --help (0) or a usage error (2)
                code = stop.code
        check_outcome(code, output.getvalue(), workdir, argv)

    run()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["train", "evaluate"])
def test_fuzz_subprocess_runs_for_real(name, files, tmp_path):
    """A few whole runs in their own process: training one step, evaluation, their exit codes and files."""
    paths, base = files
    parser = parser_of(entry(name), base[name])
    tiny = ["--max-seq-length", "64", "--max-query-length", "16", "--doc-stride", "16", "--no-eval"]

    @settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
    @given(drawn=argv_strategy(parser, paths))
    def run(drawn):
        workdir = Path(tempfile.mkdtemp(prefix="w", dir=tmp_path))  # one per example: drawn values repeat
        argv = [*base[name], *drawn, *(tiny if name == "train" else [])]
        cmd = [PYTHON, "-m", "bert_squad", *([] if name == "train" else [name]), *argv]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=workdir, env=env, timeout=300)
        check_outcome(r.returncode, r.stdout + r.stderr, workdir, argv)

    run()
