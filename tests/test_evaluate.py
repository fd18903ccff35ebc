"""Evaluation on CPU for real: 2 ranks under mpirun give a single process's files byte for byte, and
training evaluates (mid-run and at the end) under every shipped config that runs on CPU."""

import json

import pytest

from bert_squad.metrics import question_ids
from conftest import MPIRUN, ROOT, run_bert_squad, zero2_on_cpu

pytestmark = pytest.mark.slow

# 96-token windows cut the sample's paragraphs into several windows each (~750 for the v1.1 sample,
# 12 eval batches), so both ranks compute logits and windows of one question land on both.
WINDOWS = ["--max-seq-length", 96, "--doc-stride", 32, "--max-query-length", 24]
V1_KEYS = ["exact_match", "f1"]
V2_KEYS = ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total", "NoAns_exact", "NoAns_f1",
           "NoAns_total", "best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"]
V1_FILES = ["nbest_predictions.json", "predictions.json"]


def file_ids(eval_file):
    return question_ids(json.loads(eval_file.read_text())["data"])


def evaluate(model, eval_file, out, launcher=()):
    r = run_bert_squad("evaluate", "--model-dir", model, "--eval-file", eval_file, "--output-dir", out,
                       "--cache-dir", out / "cache", *WINDOWS, launcher=launcher)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.mark.parametrize("dev, keys, files", [("sample_dev", V1_KEYS, V1_FILES),
                                              ("sample_dev_v2", V2_KEYS, [*V1_FILES, "null_odds.json"])])
@pytest.mark.mpi
def test_two_ranks_write_the_single_process_files(request, tiny_model, tmp_path, dev, keys, files):
    eval_file = request.getfixturevalue(dev)
    evaluate(tiny_model, eval_file, tmp_path / "one")
    r = evaluate(tiny_model, eval_file, tmp_path / "two", launcher=MPIRUN)
    assert sorted(p.name for p in (tmp_path / "two").glob("*.json")) == sorted([*files, "eval_metrics.json"])
    for name in files:
        assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name
    assert list(json.loads((tmp_path / "two" / "predictions.json").read_text())) == file_ids(eval_file)
    metrics = json.loads((tmp_path / "two" / "eval_metrics.json").read_text())
    assert list(metrics) == [*keys, "eval_file", "questions"]
    assert metrics["questions"] == len(file_ids(eval_file))
    assert json.loads(r.stdout.splitlines()[-1]) == {k: metrics[k] for k in keys}  # printed by rank 0 only


@pytest.mark.parametrize("config, launcher", [
    pytest.param(lambda tmp: ROOT / "configs" / "ds_fp32.json", (), id="fp32"),
    pytest.param(lambda tmp: ROOT / "configs" / "ds_bf16.json", (), id="bf16"),
    pytest.param(lambda tmp: zero2_on_cpu(tmp, bf16=True), MPIRUN, id="zero2-bf16-2-ranks", marks=pytest.mark.mpi),
])
def test_training_evaluates_every_question(tiny_model, sample_train, sample_dev, tmp_path, config, launcher):
    out = tmp_path / "out"
    r = run_bert_squad("--model", tiny_model, "--train-file", sample_train, "--eval-file", sample_dev,
                       "--output-dir", out, "--cache-dir", tmp_path / "cache", "--deepspeed_config", config(tmp_path),
                       "--max-steps", 4, "--eval-every", 2, *WINDOWS, launcher=launcher)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "eval step 2: " in r.stdout
    metrics = json.loads((out / "eval_metrics.json").read_text())
    assert {"exact_match", "f1"} <= set(metrics) and metrics["questions"] == len(file_ids(sample_dev))
    assert list(json.loads((out / "predictions.json").read_text())) == file_ids(sample_dev)
