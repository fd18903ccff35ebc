"""The project's span head (bert_squad/span_head.py), on an encoder transformers ships without a question-
answering class (a tiny EuroBERT saved as its hub checkpoints are, with a masked-LM head), everywhere a
question-answering model goes: two ranks under every shipped DeepSpeed config as a CPU runs it, distributed
evaluation with --keep-best, a checkpoint resumed on another number of ranks, `export --checkpoint`, and
`evaluate`, `predict`, `answer` and `bert-squad-test` of what it saved. The families test
(tests/test_families.py) covers the rest: labels, one rank, the same world's resume, loading with
transformers alone."""

import json
from pathlib import Path

import pytest
import transformers
from helpers import MPIRUN, TINY_WINDOWS, assert_same_weights, run_bert_squad, zero_on_cpu
from packaging.version import Version

from bert_squad import span_head
from bert_squad.checkpoint import checkpoint_root
from bert_squad.model import family

pytestmark = [pytest.mark.slow, pytest.mark.mpi, pytest.mark.cpu]

# The shipped configs as a CPU runs them: fp32 and bf16 (stage 0), ZeRO-2 and ZeRO-3 with bf16 for fp16.
CONFIGS = ["ds_fp32", "ds_bf16", "zero2_bf16", "zero3_bf16"]
QUESTION, CONTEXT = "Where was Ada Novak born?", "Ada Novak was born in Lugano in 1834. She studied physics."


@pytest.fixture(scope="module")
def eurobert(tmp_path_factory):
    from tiny_models import build_tiny_model

    assert Version(transformers.__version__) >= Version(family("eurobert").since), "EuroBERT needs a newer transformers"
    return build_tiny_model("eurobert", tmp_path_factory.mktemp("tiny-eurobert"))


def config_file(name: str, tmp_path: Path):
    return name if name.startswith("ds_") else zero_on_cpu(tmp_path, int(name[4]), bf16=True)


@pytest.mark.parametrize("config", CONFIGS)
def test_two_ranks_then_one_and_the_export_of_any_checkpoint(config, eurobert, sample_train, sample_dev, tmp_path):
    """2 ranks to step 2, evaluated on both ranks at every step with --keep-best; then the step-2 checkpoint
    resumed on 1 rank to step 4. Both exports are span-head models in Hugging Face format (the modelling file
    beside the weights, the config naming it), and `export --checkpoint` of the step-4 checkpoint in one
    process is the second run's own export."""
    out, ds = tmp_path / "out", config_file(config, tmp_path)
    common = [
        *map(
            str,
            (
                "--model",
                eurobert,
                "--train-file",
                sample_train,
                "--output-dir",
                out,
                "--cache-dir",
                tmp_path / "cache",
                "--deepspeed_config",
                ds,
                "--learning-rate",
                "1e-3",
            ),
        ),
        *TINY_WINDOWS,
    ]
    r = run_bert_squad(
        *common,
        "--max-steps",
        2,
        "--checkpoint-every",
        2,
        "--eval-file",
        sample_dev,
        "--eval-every",
        1,
        "--keep-best",
        launcher=MPIRUN,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("left out: lm_head (the head it was saved with, 1 tensor)") == 1, r.stdout[-3000:]
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert metrics["world_size"] == 2 and [e["step"] for e in metrics["evals"]] == [1, 2]
    best = next(e for e in metrics["evals"] if e["step"] == metrics["best_step"])
    assert metrics["best_metrics"]["f1"] == best["f1"] == max(e["f1"] for e in metrics["evals"])
    assert_span_head_export(out)
    r = run_bert_squad(
        *common,
        "--max-steps",
        4,
        "--checkpoint-every",
        2,
        "--no-eval",
        "--resume",
        checkpoint_root(out) / "step00000002",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "written by 2 ranks, on 1 rank" in r.stdout, r.stdout[-3000:]
    export = tmp_path / "export"
    r = run_bert_squad("export", "--checkpoint", checkpoint_root(out), "--output-dir", export, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_same_weights(export, out)
    for name in ("config.json", f"{span_head.MODULE}.py"):
        assert (export / name).read_text() == (out / name).read_text(), name
    assert_span_head_export(export)


def assert_span_head_export(directory: Path) -> None:
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == ["EuroBertForQuestionAnswering"]
    assert config["auto_map"] == {"AutoModelForQuestionAnswering": f"{span_head.MODULE}.EuroBertForQuestionAnswering"}
    source = (directory / f"{span_head.MODULE}.py").read_text()
    assert source.startswith(open(span_head.__file__).read())
    assert source.endswith("EuroBertForQuestionAnswering = for_model_type('eurobert')\n")


def test_every_command_takes_what_it_saved(eurobert, sample_train, sample_dev, tmp_path):
    """A span-head model trained on 2 ranks under ZeRO-3: `evaluate` on 2 ranks scores it as the run did,
    `predict` answers as `evaluate` does, `answer` and `bert-squad-test` answer from it."""
    out = tmp_path / "out"
    r = run_bert_squad(
        "--model",
        eurobert,
        "--train-file",
        sample_train,
        "--eval-file",
        sample_dev,
        "--output-dir",
        out,
        "--cache-dir",
        tmp_path / "cache",
        "--deepspeed_config",
        zero_on_cpu(tmp_path, 3),
        "--max-steps",
        2,
        *TINY_WINDOWS,
        launcher=MPIRUN,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    common = ["--cache-dir", tmp_path / "cache", *TINY_WINDOWS]
    r = run_bert_squad(
        "evaluate",
        "--model-dir",
        out,
        "--eval-file",
        sample_dev,
        "--output-dir",
        tmp_path / "eval",
        *common,
        launcher=MPIRUN,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    scored, during = json.loads(r.stdout.splitlines()[-1]), json.loads((out / "eval_metrics.json").read_text())
    assert (scored["exact_match"], scored["f1"]) == (during["exact_match"], during["f1"])
    assert (tmp_path / "eval" / "predictions.json").read_bytes() == (out / "predictions.json").read_bytes()
    r = run_bert_squad("predict", "--model-dir", out, "--input", sample_dev, "--output-dir", tmp_path / "pred", *common)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "pred" / "predictions.json").read_bytes() == (out / "predictions.json").read_bytes()
    r = run_bert_squad(
        "answer", "--model-dir", out, "--question", QUESTION, "--context", CONTEXT, "--json", "--top-k", 3
    )
    assert r.returncode == 0, r.stderr[-3000:]
    answers = json.loads(r.stdout.splitlines()[-1])["answers"]
    assert len(answers) == 3 and all(CONTEXT[a["start"] : a["end"]] == a["text"] for a in answers)
    r = run_bert_squad(
        "test", "--model-file", out, "--eval-file", sample_dev, "--num-test-samples", 3, "--json", *TINY_WINDOWS
    )
    assert r.returncode == 0, r.stderr[-3000:]
    shown = json.loads(r.stdout.splitlines()[-1])
    predictions = json.loads((out / "predictions.json").read_text())
    assert len(shown) == 3 and all(row["prediction"] == predictions[row["id"]] for row in shown)
