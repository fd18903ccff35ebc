"""The project's span head (bert_squad/span_head.py), on an encoder transformers ships without a question-
answering class (a tiny EuroBERT saved as its hub checkpoints are, with a masked-LM head): every command takes
what a run saved with it. Elsewhere: the resume chain of tests/test_resume_anywhere.py trains it on two ranks
under every shipped DeepSpeed config as a CPU runs it, with distributed evaluation and --keep-best, resumes it on
another number of ranks and exports its checkpoints; the families test (tests/test_families.py) covers labels,
the same world's resume and loading with transformers alone."""

import json

import pytest
from helpers import (
    MPIRUN,
    TINY_WINDOWS,
    assert_span_head_export,
    inference_args,
    run_bert_squad,
    train_args,
    zero_on_cpu,
)

pytestmark = [pytest.mark.slow, pytest.mark.mpi, pytest.mark.cpu, pytest.mark.heavy]

QUESTION, CONTEXT = "Where was Ada Novak born?", "Ada Novak was born in Lugano in 1834. She studied physics."


def test_every_command_takes_what_it_saved(tiny_eurobert, sample_train, sample_dev, tmp_path):
    """A span-head model trained on 2 ranks under ZeRO-3: `evaluate` on 2 ranks scores it as the run did,
    `predict` answers as `evaluate` does, `answer` and `bert-squad-test` answer from it."""
    out = tmp_path / "out"
    steps = ["--eval-file", sample_dev, "--deepspeed_config", zero_on_cpu(tmp_path, 3), "--max-steps", 2]
    r = run_bert_squad(*train_args(tiny_eurobert, sample_train, out, *steps, cache=tmp_path / "cache"), launcher=MPIRUN)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_span_head_export(out)  # gathered from ZeRO-3's partitions
    r = run_bert_squad(
        *inference_args("evaluate", out, sample_dev, tmp_path / "eval", cache=tmp_path / "cache"), launcher=MPIRUN
    )
    assert r.returncode == 0, r.stderr[-3000:]
    scored, during = json.loads(r.stdout.splitlines()[-1]), json.loads((out / "eval_metrics.json").read_text())
    assert (scored["exact_match"], scored["f1"]) == (during["exact_match"], during["f1"])
    assert (tmp_path / "eval" / "predictions.json").read_bytes() == (out / "predictions.json").read_bytes()
    r = run_bert_squad(*inference_args("predict", out, sample_dev, tmp_path / "pred", cache=tmp_path / "cache"))
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
