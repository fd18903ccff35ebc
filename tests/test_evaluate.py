"""Evaluation on CPU for real: 2 ranks under mpirun give a single process's files byte for byte, and
training evaluates (mid-run and at the end) under every shipped config that runs on CPU."""

import json

import pytest

from bert_squad.metrics import question_ids
from helpers import MPIRUN, ROOT, run_bert_squad, zero_on_cpu

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


def evaluate(model, eval_file, out, *extra, launcher=()):
    r = run_bert_squad("evaluate", "--model-dir", model, "--eval-file", eval_file, "--output-dir", out,
                       "--cache-dir", out / "cache", *WINDOWS, *extra, launcher=launcher)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.mark.compat
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


@pytest.mark.compat
@pytest.mark.parametrize("config, launcher", [
    pytest.param(lambda tmp: ROOT / "configs" / "ds_fp32.json", (), id="fp32"),
    pytest.param(lambda tmp: ROOT / "configs" / "ds_bf16.json", (), id="bf16"),
    pytest.param(lambda tmp: zero_on_cpu(tmp, 2, bf16=True), MPIRUN, id="zero2-bf16-2-ranks", marks=pytest.mark.mpi),
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


def test_max_answer_length_bounds_every_predicted_span(tiny_model, sample_dev, tmp_path):
    """`--max-answer-length 1`: every prediction is the text of one context token, or empty where no n-best
    start and end pair is that short. With the default (30) the same model predicts longer spans too, so it
    is the option that bounds them."""
    from bert_squad.data import read_squad
    from bert_squad.model import load_tokenizer

    tokenizer = load_tokenizer(tiny_model)
    one_token = {}
    for r in read_squad(sample_dev).records:
        offsets = tokenizer(r["context"], add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        one_token[r["id"]] = {r["context"][a:b] for a, b in offsets}
    predicted = {}
    for length in (1, 30):
        evaluate(tiny_model, sample_dev, tmp_path / str(length), "--max-answer-length", length)
        predicted[length] = json.loads((tmp_path / str(length) / "predictions.json").read_text())
    longer = {qid for qid, text in predicted[30].items() if text not in one_token[qid]}
    assert longer, "with 30 tokens allowed every prediction is one token: the test shows nothing"
    spans = {qid: text for qid, text in predicted[1].items() if text}
    assert len(spans) > len(predicted[1]) / 2, predicted[1]
    assert all(text in one_token[qid] for qid, text in spans.items()), {
        qid: text for qid, text in spans.items() if text not in one_token[qid]}
