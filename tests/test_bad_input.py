"""Every bad input ends in one error line naming the culprit, exit code 2, and nothing written."""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from helpers import PYTHON, ROOT, inference_args, run_bert_squad, train_args, window_args
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from bert_squad.cli import main
from bert_squad.data import read_squad
from bert_squad.dsconfig import SHIPPED_DIR as CONFIG_DIR
from bert_squad.errors import UserError, first_line


def squad(qas, context="Ada was born in Lugano.", version="1.1"):
    return {"version": version, "data": [{"title": "T", "paragraphs": [{"context": context, "qas": qas}]}]}


GOOD_QA = {"id": "q1", "question": "Where?", "answers": [{"text": "Lugano", "answer_start": 16}]}


def run_cli(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


@pytest.fixture
def files(tmp_path, tiny_model):
    def write(name, content):
        p = tmp_path / name
        p.write_text(content if isinstance(content, str) else json.dumps(content))
        return p

    return write


CASES = {
    "malformed JSON": (lambda w: ["--train-file", w("t.json", '{"data": [')], r"t.json: malformed JSON at line 1"),
    "truncated JSON": (
        lambda w: ["--train-file", w("t.json", json.dumps(squad([GOOD_QA]))[:-20])],
        r"t.json: malformed JSON",
    ),
    "missing file": (lambda w: ["--train-file", "/nonexistent/train.json"], r"/nonexistent/train.json: no such file"),
    "missing context": (
        lambda w: ["--train-file", w("t.json", {"data": [{"title": "T", "paragraphs": [{"qas": []}]}]})],
        r"t.json: article 0 \('T'\) paragraph 0: missing field 'context'",
    ),
    "missing question": (
        lambda w: ["--train-file", w("t.json", squad([{"id": "q7", "answers": []}]))],
        r"t.json: question q7: missing field 'question'",
    ),
    "missing answers": (
        lambda w: ["--train-file", w("t.json", squad([{"id": "q8", "question": "?"}]))],
        r"t.json: question q8: missing field 'answers'",
    ),
    "answer_start off, strict": (
        lambda w: [
            "--strict",
            "--train-file",
            w("t.json", squad([dict(GOOD_QA, answers=[{"text": "Lugano", "answer_start": 3}])])),
        ],
        r"t.json: question q1: answer_start does not point at the answer text",
    ),
    "empty question, strict": (
        lambda w: ["--strict", "--train-file", w("t.json", squad([GOOD_QA, dict(GOOD_QA, id="q5", question=" \t")]))],
        r"t.json: question q5: empty question \(--strict",
    ),
    "empty eval question, strict": (
        lambda w: ["--strict", "--eval-file", w("d.json", squad([dict(GOOD_QA, id="q6", question="")]))],
        r"d.json: question q6: empty question",
    ),
    "empty context": (
        lambda w: ["--train-file", w("t.json", squad([GOOD_QA], context="  "))],
        r"t.json: article 0 \('T'\) paragraph 0: empty context",
    ),
    "unknown dataset": (lambda w: ["--dataset", "squad_v3"], r"unknown dataset 'squad_v3'"),
    "model path not a model": (lambda w: ["--model", str(w("t.json", "x").parent)], r"not a model directory"),
    "unknown ds_config key": (
        lambda w: [
            "--deepspeed_config",
            w("c.json", {"train_micro_batch_size_per_gpu": 4, "zero_optimisation": {"stage": 2}}),
        ],
        r"c.json: unknown key 'zero_optimisation'",
    ),
    "impossible batch arithmetic": (
        lambda w: ["--deepspeed_config", w("c.json", {"train_batch_size": 10, "gradient_accumulation_steps": 3})],
        r"c.json: train_batch_size 10 is not divisible by gradient_accumulation_steps 3",
    ),
    "fp16 on CPU": (lambda w: ["--deepspeed_config", str(CONFIG_DIR / "ds_zero2.json")], r"fp16.enabled needs a GPU"),
    "output dir not writable": (
        lambda w: ["--output-dir", "/proc/nope/out"],
        r"/proc/nope/out: output dir cannot be written",
    ),
    # Each field's type against the format's schema (a non-empty string such as "no" used to read as true).
    "is_impossible a string": (
        lambda w: ["--train-file", w("t.json", squad([dict(GOOD_QA, is_impossible="no")], version="v2.0"))],
        r"t.json: question q1: field 'is_impossible' should be true or false, not 'no'",
    ),
    "answer_start a boolean": (
        lambda w: [
            "--train-file",
            w("t.json", squad([dict(GOOD_QA, answers=[{"text": "Ada", "answer_start": False}])])),
        ],
        r"t.json: question q1 answer: field 'answer_start' should be an integer, not False",
    ),
    "title a number": (
        lambda w: ["--train-file", w("t.json", {"data": [{"title": 7, "paragraphs": []}]})],
        r"t.json: article 0: field 'title' should be a string, not",
    ),
    "version a number": (
        lambda w: ["--train-file", w("t.json", dict(squad([GOOD_QA]), version=2.0))],
        r"t.json: field 'version' should be a string, not",
    ),
    "impossible with answers": (
        lambda w: ["--eval-file", w("d.json", squad([dict(GOOD_QA, is_impossible=True)], version="v2.0"))],
        r"d.json: question q1: is_impossible is true, yet it has answers",
    ),
    # Path options of the wrong kind, found before any work.
    "cache dir a file": (lambda w: ["--cache-dir", w("c", "x")], r"--cache-dir \S+/c: not a directory$"),
    "cache dir under a file": (
        lambda w: ["--cache-dir", f"{w('c', 'x')}/sub"],
        r"--cache-dir \S+/c/sub: not a directory \(\S+/c is a file\)",
    ),
    "output dir a file": (lambda w: ["--output-dir", w("o", "x")], r"--output-dir \S+/o: not a directory$"),
    # Numbers a run cannot use (each was a traceback, or silently something else: -1 meant "every step").
    **{
        f"{option} {value}": (
            lambda w, option=option, value=value: [option, value],
            rf"{option} {value}(\.0)?: must be",
        )
        for option, value in [
            ("--epochs", "nan"),
            ("--epochs", "inf"),
            ("--max-steps", "-3"),
            ("--warmup-ratio", "2"),
            ("--seed", "-1"),
            ("--eval-every", "-1"),
            ("--checkpoint-every", "-1"),
            ("--peak-tflops", "0"),
            ("--null-score-diff-threshold", "nan"),
            ("--dropout", "1.5"),
            ("--attention-dropout", "-0.1"),
        ]
    },
    "windows longer than the model": (
        lambda w: ["--max-seq-length", "1024"],
        r"--max-seq-length 1024: \S+ takes at most 512 tokens",
    ),
    # What only DeepSpeed's engine would check, on every rank and after the output dir was made.
    "an optimizer DeepSpeed lacks": (
        lambda w: [
            "--deepspeed_config",
            w("c.json", with_section("optimizer", {"type": "Adamm", "params": {"lr": 1e-4}})),
        ],
        r"c.json: DeepSpeed cannot build its engine: Adamm is not a supported DeepSpeed Optimizer$",
    ),
    "a scheduler DeepSpeed lacks": (
        lambda w: [
            "--deepspeed_config",
            w("c.json", with_section("scheduler", {"type": "WarmupLinear", "params": {}})),
        ],
        r"c.json: DeepSpeed cannot build its engine: DeepSpeed does not recognize LR scheduler WarmupLinear$",
    ),
    "betas of one number": (
        lambda w: [
            "--deepspeed_config",
            w(
                "c.json",
                with_section(
                    "optimizer", {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9], "torch_adam": True}}
                ),
            ),
        ],
        r"c.json: DeepSpeed cannot build its engine: ",
    ),
    "an optimizer param it does not take": (
        lambda w: [
            "--deepspeed_config",
            w("c.json", with_section("optimizer", {"type": "SGD", "params": {"lr": 1e-4, "betas": [0.9, 0.99]}})),
        ],
        r"c.json: DeepSpeed cannot build its engine: .*'betas'",
    ),
    "a scheduler param it does not take": (
        lambda w: [
            "--deepspeed_config",
            w(
                "c.json",
                with_section(
                    "scheduler", {"type": "WarmupLR", "params": {"warmup_num_steps": "auto", "total_num_steps": "auto"}}
                ),
            ),
        ],
        r"c.json: DeepSpeed cannot build its engine: .*'total_num_steps'",
    ),
    # A config given back (a run's deepspeed_config.json of another length or rate): the options typed win, or the
    # run refuses; the file's fixed values trained the old run's schedule, in silence.
    "a schedule the options decide otherwise": (
        lambda w: [
            "--deepspeed_config",
            w("c.json", with_section("scheduler", {"type": "WarmupDecayLR", "params": {"total_num_steps": 20}})),
        ],
        r"c.json: scheduler.params.total_num_steps is 20, where the run's length \(--max-steps, or --epochs of its "
        r'features\) makes it 1: write "auto" there to follow the options$',
    ),
    "a peak rate the options decide otherwise": (
        lambda w: [
            "--learning-rate",
            "3e-5",
            "--deepspeed_config",
            w("c.json", with_section("scheduler", {"type": "WarmupDecayLR", "params": {"warmup_max_lr": 1e-4}})),
        ],
        r"c.json: scheduler.params.warmup_max_lr is 0.0001, where the optimizer's lr \(--learning-rate\) makes it "
        r"3e-05: write",
    ),
    # Values DeepSpeed's engine took wrongly: a negative norm trained unclipped, a string switch read as true, a
    # fused kernel's argument of the wrong type was a TypeError at the first step, a micro batch no machine holds
    # was killed for memory; each after the output dir was made.
    "a negative gradient norm": (
        lambda w: ["--deepspeed_config", w("c.json", fp32_with(gradient_clipping=-1))],
        r"c.json: gradient_clipping must be a norm of 0 or more \(0: no clipping\), not -1$",
    ),
    "a switch that is a string": (
        lambda w: [
            "--deepspeed_config",
            w("c.json", with_section("optimizer", {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": "no"}})),
        ],
        r"c.json: optimizer.params.torch_adam must be true, false or null, not 'no'$",
    ),
    "a fused kernel's argument of the wrong type": (
        lambda w: [
            "--deepspeed_config",
            w(
                "c.json",
                with_section(
                    "optimizer",
                    {"type": "AdamW", "params": {"lr": 1e-4, "fused": True, "torch_adam": True, "eps": [1e-8]}},
                ),
            ),
        ],
        r"c.json: DeepSpeed cannot build its engine: ",
    ),
    # Each a traceback once, after the output dir was made: bf16 trained where DeepSpeed read "false" as false (and
    # the run as bf16), a division by zero at the first step, the async_io op's build for a directory that is not
    # there, an assertion of torch's AdamW on a CPU, and wall_clock_breakdown blamed on the optimizer.
    "a switch DeepSpeed reads otherwise": (
        lambda w: ["--deepspeed_config", w("c.json", fp32_with(bf16={"enabled": "false"}))],
        r'c.json: bf16.enabled is the string "false", which DeepSpeed reads as false: write false$',
    ),
    "steps_per_print 0": (
        lambda w: ["--deepspeed_config", w("c.json", fp32_with(steps_per_print=0))],
        r"c.json: steps_per_print must be a positive integer, not 0$",
    ),
    "an NVMe offload path that is not there": (
        lambda w: [
            "--deepspeed_config",
            w(
                "c.json",
                fp32_with(zero_optimization={"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/no/nvme"}}),
            ),
        ],
        r"c.json: zero_optimization.offload_param.nvme_path /no/nvme: cannot be written: No such file or directory$",
    ),
    "a GPU-only optimizer option on a CPU": (
        lambda w: [
            "--deepspeed_config",
            w(
                "c.json",
                with_section(
                    "optimizer", {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True, "capturable": True}}
                ),
            ),
        ],
        r"c.json: optimizer.params are not what AdamW takes on cpu: If capturable=True, params and state_steps must be",
    ),
    "wall_clock_breakdown a string": (
        lambda w: ["--deepspeed_config", w("c.json", fp32_with(wall_clock_breakdown="yes"))],
        r"c.json: wall_clock_breakdown must be true or false, not 'yes'$",
    ),
    "a micro batch no machine holds": (
        lambda w: ["--deepspeed_config", w("c.json", fp32_with(train_micro_batch_size_per_gpu=10**9))],
        r"c.json: train_micro_batch_size_per_gpu 1000000000 at --max-seq-length \d+ needs at least [\d.]+ GiB for "
        r"the activations alone, more than this device's",
    ),
    "a micro batch flag no machine holds": (
        lambda w: ["--micro-batch-size", str(10**9)],
        r"--micro-batch-size: train_micro_batch_size_per_gpu 1000000000 at --max-seq-length \d+ needs at least ",
    ),
    "a micro batch flag of 0": (lambda w: ["--micro-batch-size", "0"], r"--micro-batch-size must be positive, not 0$"),
    # Valid JSON that is not Unicode: a lone UTF-16 surrogate ("\ud800"), which no tokenizer takes (a TypeError
    # traceback, once). Repaired and counted unless --strict (test_text_no_tokenizer_takes_...); an id never.
    "a lone surrogate, --strict": (
        lambda w: ["--strict", "--train-file", w("t.json", squad([dict(GOOD_QA, question="Where\ud800?")]))],
        r"t.json: question q1: its question holds a lone UTF-16 "
        r"surrogate \(\\ud800 at character 5\), which is not Unicode",
    ),
    "a lone surrogate in an id": (
        lambda w: ["--train-file", w("t.json", squad([dict(GOOD_QA, id="q\udfff")]))],
        r"t.json: question id 'q\\udfff' holds a lone UTF-16 surrogate \(\\udfff at "
        r"character 1\), which is not Unicode text: no predictions file can name it",
    ),
    # JSON nested deeper than Python's parser goes (a RecursionError traceback, once).
    "a data file nested too deep": (
        lambda w: ["--train-file", w("t.json", "[" * 100_000 + "]" * 100_000)],
        r"t.json: JSON nested deeper than the parser allows",
    ),
    # The Trainer's precision flags each name a shipped config: with another, or with each other, one line.
    "--bf16 with a config": (
        lambda w: ["--bf16", "--deepspeed-config", "ds_fp32"],
        r"--bf16 and --deepspeed-config ds_fp32: each names the run's DeepSpeed config \(--bf16 ds_bf16, --fp16 "
        r"ds_fp16\); give one$",
    ),
    "--bf16 with --fp16": (lambda w: ["--fp16", "--bf16"], r"--bf16 and --fp16: each names the run's DeepSpeed config"),
    "a config nested too deep": (
        lambda w: ["--deepspeed_config", w("c.json", "[" * 100_000 + "]" * 100_000)],
        r"c.json: JSON nested deeper than the parser allows",
    ),
}


def fp32_with(**values):
    """The shipped fp32 config with top-level values replaced."""
    return {**json.loads((CONFIG_DIR / "ds_fp32.json").read_text()), **values}


def with_section(name, section):
    """The shipped fp32 config with one section replaced."""
    return fp32_with(**{name: section})


# On a GPU host fp16 trains (tests/test_gpu.py), and torch's AdamW takes capturable=True.
CPU_ONLY = ("fp16 on CPU", "a GPU-only optimizer option on a CPU")


def assert_refused(capsys, argv, pattern, out, prog="bert-squad"):
    """One error line matching `pattern`, exit code 2, and no output directory."""
    code, err = run_cli(capsys, argv)
    assert code == 2, err
    assert len(err) == 1, err
    assert err[0].startswith(f"{prog}: error: ") and re.search(pattern, err[0]), err[0]
    assert not out.exists()


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.cpu) if c in CPU_ONLY else c for c in CASES])
def test_bad_input_is_one_line_exit_2_nothing_written(case, files, tiny_model, sample_train, tmp_path, capsys):
    make_args, pattern = CASES[case]
    out = tmp_path / "out"
    extra = make_args(files)
    argv = train_args(tiny_model, sample_train, out, "--max-steps", 1, *extra, cache=tmp_path / "cache", windows=[])
    assert_refused(capsys, argv, pattern, out)


@pytest.mark.parametrize("option", ["--cache-dir", "--output-dir"])
def test_evaluate_refuses_a_file_for_a_directory(option, tiny_model, sample_dev, tmp_path, capsys):
    """evaluate's directories are checked before the model runs (they were a traceback after it)."""
    (tmp_path / "a-file").write_text("x")
    dirs = {"--cache-dir": tmp_path / "cache", "--output-dir": tmp_path / "out", option: tmp_path / "a-file"}
    argv = [
        "evaluate",
        "--model-dir",
        str(tiny_model),
        "--eval-file",
        str(sample_dev),
        *[str(part) for pair in dirs.items() for part in pair],
    ]
    assert_refused(
        capsys, argv, rf"{option} \S+/a-file: not a directory$", tmp_path / "out", prog="bert-squad evaluate"
    )


# A tokenizer that cannot place a context: (family whose pipeline it breaks, how), tests/tiny_models.py.
BROKEN_TOKENIZERS = {
    "empty vocabulary": ("roberta", r"turns the context of question \S+ into no tokens"),
    "no second sequence": ("modernbert", r"does not mark the context of question \S+ as a second"),
}


@pytest.fixture(scope="module", params=BROKEN_TOKENIZERS)
def broken_tokenizer(request, tiny_family, tmp_path_factory):
    from tiny_models import break_tokenizer

    family, pattern = BROKEN_TOKENIZERS[request.param]
    return break_tokenizer(tiny_family(family), tmp_path_factory.mktemp("broken") / family, request.param), pattern


@pytest.mark.parametrize("command", ["train", "evaluate", "answer"])
def test_a_tokenizer_that_cannot_place_the_context_is_refused_first(
    broken_tokenizer, command, sample_train, sample_dev, tmp_path, capsys
):
    """Checked once on the first question, before features are built (it died in features.prepare_train
    on `ctx[0]`, after the output dir was made)."""
    model, pattern = broken_tokenizer
    out = tmp_path / "out"
    argv = {
        "train": train_args(model, sample_train, out, "--max-steps", 1, cache=tmp_path / "cache", windows=[]),
        "evaluate": [
            "evaluate",
            "--model-dir",
            model,
            "--eval-file",
            sample_dev,
            "--output-dir",
            out,
            "--cache-dir",
            tmp_path / "cache",
        ],
        "answer": ["answer", "--model-dir", model, "--question", "Who?", "--context", "Ada wrote it."],
    }[command]
    prog = "bert-squad" if command == "train" else f"bert-squad {command}"
    assert_refused(
        capsys,
        [str(a) for a in argv],
        rf"^{prog}: error: {re.escape(str(model))}: its tokenizer {pattern}",
        out,
        prog=prog,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "variable, value, message",
    [
        ("WORLD_SIZE", "abc", "WORLD_SIZE=abc: not a whole number"),
        ("BERT_SQUAD_CACHE", "{file}", "BERT_SQUAD_CACHE={file}: not a directory"),
        ("BERT_SQUAD_DEBUG", "yes", "BERT_SQUAD_DEBUG=yes: use 1"),
        ("DS_ACCELERATOR", "gpu", "DS_ACCELERATOR=gpu: not an accelerator DeepSpeed knows"),
    ],
)
def test_an_environment_variable_that_cannot_be_is_one_line(
    variable, value, message, tiny_model, sample_train, tmp_path
):
    """As a user's shell sets them, in a process of its own: each is checked where it is read."""
    (tmp_path / "a-file").write_text("x")
    value, message = (text.replace("{file}", str(tmp_path / "a-file")) for text in (value, message))
    env = {variable: value, **({"RANK": "0"} if variable == "WORLD_SIZE" else {})}
    out = tmp_path / "out"
    r = run_bert_squad(*train_args(tiny_model, sample_train, out, "--max-steps", 1, windows=[]), env=env, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"bert-squad: error: {message}"), lines[0]
    assert not out.exists()


def test_resume_path_that_is_no_checkpoint_writes_nothing(capsys, tiny_model, sample_train, tmp_path):
    out = tmp_path / "out"
    code = main(train_args(tiny_model, sample_train, out, "--resume", tmp_path / "nothing-here", windows=[]))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [
        f"bert-squad: error: {tmp_path / 'nothing-here'}: no such checkpoint ({tmp_path} holds no complete checkpoint)"
    ], err
    assert not out.exists()


@pytest.mark.parametrize(
    "left, holds",
    [
        (["deepspeed_config.json", "train_metrics.json"], "a finished run"),
        (["deepspeed_config.json", "checkpoints/"], "a run or a model (deepspeed_config.json, checkpoints)"),
        (["deepspeed_config.json"], "a run or a model (deepspeed_config.json)"),
        (["bert_squad_task.json", "config.json"], "a run or a model (bert_squad_task.json)"),
    ],
    ids=["finished", "stopped", "crashed", "exported"],
)
@pytest.mark.parametrize("command", ["train", "config", "check-cache"])
def test_an_output_dir_that_holds_a_run_is_refused(command, left, holds, capsys, tiny_model, sample_train, tmp_path):
    """What a run (finished, stopped at a checkpoint, crashed after its start) or an export leaves: a training
    there, its plan and the job's cache check are refused in one line naming the directory and the ways on,
    before anything is read or written."""
    out = tmp_path / "out"
    for name in left:
        (out / name).mkdir(parents=True) if name.endswith("/") else (out.mkdir(exist_ok=True), (out / name).touch())
    before = sorted(out.rglob("*"))
    argv = train_args(tiny_model, sample_train, out, "--max-steps", 1, cache=tmp_path / "cache", windows=[])
    code, err = run_cli(capsys, argv if command == "train" else [command, *argv])
    prog = "bert-squad" if command == "train" else f"bert-squad {command}"
    assert code == 2 and err == [
        f"{prog}: error: --output-dir {out} holds {holds}: continue it with --resume auto, or replace it with "
        f"--overwrite-output-dir (which removes its outputs and checkpoints first)"
    ], err
    assert sorted(out.rglob("*")) == before and not (tmp_path / "cache").exists()
    code, err = run_cli(capsys, [*argv, "--resume", "auto", "--overwrite-output-dir"])
    assert code == 2 and err == [
        "bert-squad: error: --resume continues the run in --output-dir, --overwrite-output-dir replaces it: give one"
    ], err


def test_check_cache_checks_every_file_it_is_given_and_creates_nothing(capsys, tiny_model, sample_train, tmp_path):
    """The job's fail-fast check reads each file the run names (train and eval files, the DeepSpeed config) and
    proves the output dir can be made, leaving nothing behind: not the output dir, not a probe."""
    out = tmp_path / "new" / "out"
    argv = ["check-cache", "--model", str(tiny_model), "--train-file", str(sample_train), "--output-dir", str(out)]
    code, err = run_cli(capsys, argv)
    assert code == 0, err
    assert list(tmp_path.iterdir()) == []
    for extra, message in (
        (["--eval-file", str(tmp_path / "dev.json")], f"{tmp_path / 'dev.json'}: no such file"),
        (["--deepspeed-config", "ds_fp33"], "ds_fp33: no such DeepSpeed config"),
        (["--train-file", str(tmp_path)], f"{tmp_path}: is a directory, not a SQuAD JSON file"),
    ):
        code, err = run_cli(capsys, [*argv, *extra])
        assert code == 2 and len(err) == 1 and message in err[0], err
    (tmp_path / "dev.json").write_text('{"data": [')
    code, err = run_cli(capsys, [*argv, "--eval-file", str(tmp_path / "dev.json")])
    assert code == 2 and err == [
        f"bert-squad check-cache: error: {tmp_path / 'dev.json'}: malformed JSON at line 1 column 11: Expecting value"
    ], err
    (tmp_path / "ds.json").write_text("[]")  # JSON, but not what a run takes: refused as the run refuses it
    code, err = run_cli(capsys, [*argv, "--deepspeed-config", str(tmp_path / "ds.json")])
    assert code == 2 and err == [
        f"bert-squad check-cache: error: {tmp_path / 'ds.json'}: a DeepSpeed config is a JSON object"
    ], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dev.json", "ds.json"]


def test_export_points_from_a_run_to_its_checkpoints_and_names_a_missing_step(capsys, tmp_path):
    """`export --checkpoint RUN_DIR` says where the run's checkpoints are; a step that is not there says so, with
    the ones that are."""
    run = tmp_path / "run"
    (run / "checkpoints" / "step00000004").mkdir(parents=True)
    (run / "checkpoints" / "step00000004" / "complete").write_text("{}")
    out = tmp_path / "exported"
    code, err = run_cli(capsys, ["export", "--checkpoint", str(run), "--output-dir", str(out)])
    assert code == 2 and err == [
        f"bert-squad export: error: {run}: a run's output dir, not a checkpoint: give {run / 'checkpoints'} (its "
        f"newest checkpoint) or one of its step<N>"
    ], err
    missing = run / "checkpoints" / "step00000009"
    code, err = run_cli(capsys, ["export", "--checkpoint", str(missing), "--output-dir", str(out)])
    assert code == 2 and err == [
        f"bert-squad export: error: {missing}: no such checkpoint (checkpoints there: step00000004)"
    ], err
    assert not out.exists()


def test_answer_start_mismatch_is_counted_and_skipped(tmp_path):
    bad = dict(GOOD_QA, id="q2", answers=[{"text": "Lugano", "answer_start": 3}])
    p = tmp_path / "t.json"
    p.write_text(json.dumps(squad([GOOD_QA, bad])))
    ex = read_squad(p)
    assert [r["id"] for r in ex.records] == ["q1"] and ex.skipped_ids == ["q2"]


def test_empty_questions_are_counted_and_skipped(tmp_path):
    qas = [
        GOOD_QA,
        dict(GOOD_QA, id="q2", question=""),
        dict(GOOD_QA, id="q3", question=" \n "),
        dict(GOOD_QA, id="q4", answers=[{"text": "Lugano", "answer_start": 3}]),
    ]
    p = tmp_path / "t.json"
    p.write_text(json.dumps(squad(qas)))
    ex = read_squad(p)
    assert [r["id"] for r in ex.records] == ["q1"]
    assert ex.empty_question_ids == ["q2", "q3"] and ex.skipped_ids == ["q4"]
    assert ex.skip_summary() == "1 questions skipped (answer_start off its text), 2 skipped (empty question)"


@pytest.mark.slow
def test_start_up_lines_count_empty_questions(tiny_model, sample_train, sample_dev, tmp_path):
    """An empty question in the train or eval file is skipped, and the start-up lines say how many."""

    def with_empty_questions(path, n):
        doc = json.loads(path.read_text())
        for qa in doc["data"][0]["paragraphs"][0]["qas"][:n]:
            qa["question"] = "" if n > 1 else "\t "
        out = tmp_path / path.name
        out.write_text(json.dumps(doc))
        return out

    train, dev = with_empty_questions(sample_train, 2), with_empty_questions(sample_dev, 1)
    windows = window_args(96, 16, None)
    r = run_bert_squad(
        *train_args(
            tiny_model,
            train,
            tmp_path / "out",
            "--eval-file",
            dev,
            "--max-steps",
            1,
            cache=tmp_path / "c",
            windows=windows,
        )
    )
    assert r.returncode == 0, r.stderr[-3000:]
    questions = {
        p: sum(len(para["qas"]) for a in json.loads(p.read_text())["data"] for para in a["paragraphs"])
        for p in (train, dev)
    }
    assert (
        f"train {train}: {questions[train] - 2} questions" in r.stdout
        and "0 questions skipped (answer_start off its text), 2 skipped (empty question)" in r.stdout
    ), r.stdout
    assert f"eval {dev}: {questions[dev] - 1} questions" in r.stdout and "1 skipped (empty question)" in r.stdout
    assert len(json.loads((tmp_path / "out" / "predictions.json").read_text())) == questions[dev] - 1


@pytest.mark.parametrize(
    "argv, line",
    [
        (["evalute", "--model-dir", "m"], "unknown command 'evalute' (did you mean 'evaluate'?)"),
        (["sumarize", "runs/x"], "unknown command 'sumarize' (did you mean 'summarize'?)"),
        (["frobnicate"], "unknown command 'frobnicate' (the commands: config, download, check-cache, evaluate,"),
    ],
)
def test_an_unknown_command_is_named_with_the_nearest(argv, line, capsys):
    """A first word that names no command is one line naming it and the nearest command (training, the default,
    takes options only), not an "unrecognized arguments" of the training's."""
    code, err = run_cli(capsys, argv)
    assert code == 2 and len(err) == 1 and err[0].startswith(f"bert-squad: error: {line}"), err


def test_version_says_the_packages(capsys):
    from bert_squad import __version__

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out == f"bert-squad {__version__}\n"


def test_debug_shows_the_traceback(tmp_path, capsys):
    code = main(["--debug", "--train-file", str(tmp_path / "missing.json"), "--model", str(tmp_path)])
    assert code == 2
    assert "Traceback" in capsys.readouterr().err


@pytest.mark.parametrize(
    "err, line",
    [
        (ValueError("\n  first problem  \nthe detail\n"), "first problem"),  # leading blank lines, padding
        (OSError(""), "OSError"),
        (KeyError(), "KeyError"),  # nothing to say but the type
        (RuntimeError("  \n\t\n"), "RuntimeError"),  # only blanks
        (AssertionError("one line"), "one line"),
    ],
)
def test_a_library_error_is_said_in_its_first_line(err, line):
    """Every place that reports a library's error (model and tokenizer loading, DeepSpeed's checks and its
    converter, the hub, a torch device) says it in the same one line."""
    assert first_line(err) == line


# --- fuzzing: nothing but UserError, whatever the file holds --------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 50) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "data",
                    "paragraphs",
                    "context",
                    "qas",
                    "id",
                    "question",
                    "answers",
                    "text",
                    "answer_start",
                    "is_impossible",
                    "title",
                ]
            ),
            inner,
            max_size=5,
        )
    ),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=json_values)
def test_fuzz_reader_raises_only_user_errors(doc, tmp_path):
    p = tmp_path / "f.json"
    p.write_text(json.dumps(doc))
    try:
        ex = read_squad(p)
    except UserError as err:
        assert str(err).startswith(str(p))
    else:
        for r in ex.records:
            for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"]):
                assert r["context"][s : s + len(t)] == t


# Words the sample's WordPiece vocabulary splits in different ways (accents folded, punctuation split off,
# a long word cut into pieces), joined by different whitespace, or by none next to punctuation: an answer
# of whole words starts and ends on token boundaries, so a window that holds it can label exactly its
# characters, and a token that touches it (a comma right after it) is not part of it.
PUNCTUATION = [",", ".", "(", ")"]
WORDS = [*PUNCTUATION, "Ada", "was", "born", "in", "Lugano", "1834", "the", "née", "co-op", "x" * 30, "ünï", "Krakow's"]
SEPARATORS = [" ", "  ", "\n", " \t "]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_an_answer_is_labelled_exactly_in_every_window_that_holds_it(data, tiny_model):
    """Every window whose context covers the whole answer labels exactly the answer's characters, so at
    least one window does whenever one holds it; every other window labels CLS. (Labelling every window
    CLS, or a token beside the answer, fails here.)"""
    from bert_squad.config import WindowConfig
    from bert_squad.features import _tokenize, prepare_train
    from bert_squad.model import load_tokenizer

    tok = load_tokenizer(tiny_model)
    words = data.draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=120))
    pieces = [
        w + data.draw(st.sampled_from(([""] if {w, after} & set(PUNCTUATION) else []) + SEPARATORS))
        for w, after in zip(words, [*words[1:], ""])
    ]
    starts = [sum(map(len, pieces[:k])) for k in range(len(pieces))]
    first = data.draw(st.integers(0, len(words) - 1))
    last = data.draw(st.integers(first, min(len(words) - 1, first + 8)))
    context, start, end = "".join(pieces), starts[first], starts[last] + len(words[last])
    question = data.draw(st.text(min_size=1, max_size=40))
    assume(question.strip())  # the reader drops blank questions before features are built
    rec = {
        "id": "f",
        "title": "",
        "context": context,
        "question": question,
        "answers": {"text": [context[start:end]], "answer_start": [start]},
        "is_impossible": False,
    }
    win = WindowConfig(data.draw(st.integers(32, 96)), data.draw(st.integers(4, 16)), data.draw(st.integers(4, 12)))
    batch = {k: [v] for k, v in dict(rec, index=0).items()}
    enc = prepare_train(batch, tok, win)
    offsets = _tokenize(batch, tok, win)["offset_mapping"]
    holding = 0
    for i, (s, e) in enumerate(zip(enc["start_positions"], enc["end_positions"])):
        assert len(enc["input_ids"][i]) <= win.max_seq_length
        context_tokens = [t for t, seq in enumerate(enc.sequence_ids(i)) if seq == 1]
        holds = offsets[i][context_tokens[0]][0] <= start and offsets[i][context_tokens[-1]][1] >= end
        holding += holds
        if holds:
            assert (offsets[i][s][0], offsets[i][e][1]) == (start, end), (i, s, e, context[start:end])
            assert {s, e} <= set(context_tokens)
        else:
            assert (s, e) == (0, 0), (i, s, e)
    # Consecutive windows share --doc-stride tokens, so an answer no longer than that lies whole in one.
    assert holding or len(tok(context[start:end], add_special_tokens=False)["input_ids"]) > win.doc_stride


# --- text a tokenizer cannot take, through the command line -------------------------------------------


def damaged_text_file(path: Path) -> Path:
    """A SQuAD file whose text reaches a tokenizer in the shapes it refuses or reduces to nothing: lone UTF-16
    surrogates (valid JSON escapes) in a context, a question and an answer, and a context of control
    characters only (BERT's normalizer drops them all: a context of no tokens)."""
    context = "Ada was born in Lugano."
    paragraphs = [
        {"context": context + " \ud800", "qas": [GOOD_QA]},
        {"context": context, "qas": [dict(GOOD_QA, id="q2", question="Where\udfff?")]},
        {
            "context": "Ada was born in L\udc80gano.",
            "qas": [dict(GOOD_QA, id="q3", answers=[{"text": "L\udc80gano", "answer_start": 16}])],
        },
        {"context": "\x01\x02\x03", "qas": [dict(GOOD_QA, id="q4", answers=[{"text": "\x02", "answer_start": 1}])]},
    ]
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "T", "paragraphs": paragraphs}]}))
    assert "\\ud800" in path.read_text()  # escaped in the file: valid JSON, not Unicode once read
    return path


@pytest.mark.slow
def test_text_no_tokenizer_takes_is_repaired_and_counted(tiny_model, tmp_path):
    """Training, evaluation and prediction take such a file (each was a TypeError or IndexError traceback):
    the surrogates replaced by U+FFFD (one character for one, so the answers keep their offsets) and counted
    as the start-up lines count skipped questions; the context of no tokens trains on CLS, counted with the
    answers no window holds."""
    data, out = damaged_text_file(tmp_path / "damaged.json"), tmp_path / "out"
    windows = window_args(64, 16, 16)
    r = run_bert_squad(
        *train_args(
            tiny_model, data, out, "--eval-file", data, "--max-steps", 1, cache=tmp_path / "cache", windows=windows
        )
    )
    assert r.returncode == 0, r.stderr[-3000:]
    counts = json.loads((out / "train_metrics.json").read_text())["features"]
    assert counts["repaired_surrogates"] == 3 and counts["answers_in_no_window"] == 1, counts
    assert counts["examples"] == 4 and r.stdout.count("3 repaired (lone UTF-16 surrogates replaced by U+FFFD)") == 2
    predictions = json.loads((out / "predictions.json").read_text(encoding="utf-8"))
    assert sorted(predictions) == ["q1", "q2", "q3", "q4"]
    r = run_bert_squad(
        *inference_args("predict", out, data, tmp_path / "predicted", cache=tmp_path / "cache", windows=windows)
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((tmp_path / "predicted" / "predictions.json").read_text(encoding="utf-8")) == predictions


def test_answer_refuses_text_no_tokenizer_takes_in_one_line(tiny_model, tmp_path, capsys):
    """`answer` has nothing to count repairs in: a lone surrogate in its input is one line naming the line of
    the file, or the option whose bytes were not UTF-8 (Python decodes those to lone surrogates)."""
    lines = tmp_path / "q.jsonl"
    lines.write_text(
        json.dumps({"question": "Where?", "context": "Ada was born in Lugano."})
        + "\n"
        + json.dumps({"question": "Where?", "context": "Ada was born in \ud800Lugano."})
        + "\n"
    )
    code, err = run_cli(capsys, ["answer", "--model-dir", str(tiny_model), "--input", str(lines)])
    assert code == 2 and err == [
        f"bert-squad answer: error: {lines}:2: field 'context' holds a lone UTF-16 "
        f"surrogate (\\ud800 at character 16), which is not Unicode text: no tokenizer "
        f"takes it"
    ], err
    r = subprocess.run(
        [
            PYTHON,
            "-m",
            "bert_squad",
            "answer",
            "--model-dir",
            str(tiny_model),
            "--question",
            b"Wh\xffere?",
            "--context",
            "Ada was born in Lugano.",
        ],
        capture_output=True,
        cwd=ROOT,
        timeout=300,
        env={**os.environ, "LC_ALL": "C.UTF-8"},
    )
    assert r.returncode == 2 and r.stderr.decode().strip().splitlines() == [
        "bert-squad answer: error: --question holds a lone UTF-16 surrogate (\\udcff at character 2), which is "
        "not Unicode text: no tokenizer takes it (a byte that is not UTF-8?)"
    ], r.stderr.decode()[-2000:]


# Run in a fresh interpreter (the tests' forked runs have the libraries loaded already): the command line, then
# on the way out the heavy libraries it loaded.
LOADED_TAP = """
import atexit, sys
atexit.register(lambda: print("loaded", [m for m in ("torch", "deepspeed", "transformers", "datasets")
                                          if m in sys.modules], file=sys.stderr))
from bert_squad.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--train-file", "{missing}"], "{missing}: no such file"),
        (["--eval-file", "{missing}"], "{missing}: no such file"),
        (["--deepspeed-config", "{missing}"], "{missing}: no such DeepSpeed config"),
        (["--deepspeed-config", "{not_json}"], "{not_json}: malformed JSON at line 1"),
        (["--output-dir", "{a_file}"], "--output-dir {a_file}: not a directory"),
        (["--model", "{missing}"], "{missing}: no such model directory"),
        (["config", "--train-file", "{missing}"], "{missing}: no such file"),
        (["evaluate", "--model-dir", "{model}", "--eval-file", "{missing}", "--output-dir", "o"], "{missing}: no such"),
        (["predict", "--model-dir", "{missing}", "--input", "{train}", "--output-dir", "o"], "{missing}: no such"),
        (["answer", "--model-dir", "{missing}", "--question", "Q", "--context", "C"], "{missing}: no such"),
        (["test", "--model-dir", "{missing}", "--eval-file", "{train}"], "{missing}: no such"),
    ],
)
def test_a_bad_path_fails_before_the_libraries_load(argv, said, tiny_model, sample_train, tmp_path):
    """A missing file, a config that is no JSON, an output dir that is a file: one line, exit 2, and torch,
    DeepSpeed, transformers and datasets never imported (a training run's are checked by bert_squad/preflight.py)."""
    (tmp_path / "a_file").write_text("")
    (tmp_path / "not_json").write_text("{")
    names = dict(missing=tmp_path / "missing.json", not_json=tmp_path / "not_json", a_file=tmp_path / "a_file")
    names.update(model=tiny_model, train=sample_train)
    command = [a.format(**names) for a in argv]
    training = ["--model", str(tiny_model), "--train-file", str(sample_train), "--output-dir", str(tmp_path / "o")]
    if command[0] == "config":  # a training run's arguments, the case's last (an option given twice: the last wins)
        command = ["config", *training, *command[1:]]
    elif command[0].startswith("--"):
        command = [*training, *command]
    r = subprocess.run([PYTHON, "-c", LOADED_TAP, *command], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 2, r.stderr[-3000:]
    assert said.format(**names) in lines[0] and ": error: " in lines[0], lines
    assert lines[1] == "loaded []", lines
