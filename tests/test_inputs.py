"""Set-ups that used to crash or refuse each other: they now run, or stop with one line before anything
is written."""

import json
import random

import numpy as np
import pytest
import torch

from bert_squad.checkpoint import _rng_state, _set_rng_state
from bert_squad.cli import main
from bert_squad.config import WindowConfig
from bert_squad.dsconfig import SHIPPED_DIR, locate
from bert_squad.errors import UserError
from helpers import run_bert_squad


def test_default_stride_follows_the_window_length():
    assert WindowConfig().doc_stride == 128
    short = WindowConfig(max_seq_length=128)  # 128 - 64 - 3 = 61 tokens of context per window
    assert short.doc_stride == 30 and short.doc_stride < 61
    assert WindowConfig(max_seq_length=128, doc_stride=40).doc_stride == 40
    with pytest.raises(UserError, match="--doc-stride 61 must leave room"):
        WindowConfig(max_seq_length=128, doc_stride=61)
    with pytest.raises(UserError, match="--max-seq-length 66 leaves no room"):
        WindowConfig(max_seq_length=66)


def test_shipped_configs_by_name_or_path(tmp_path):
    assert locate("ds_bf16") == SHIPPED_DIR / "ds_bf16.json" == locate("ds_bf16.json")
    own = tmp_path / "mine.json"
    own.write_text("{}")
    assert locate(str(own)) == own
    with pytest.raises(UserError, match="ds_bf17: no such DeepSpeed config .*ds_bf16, ds_fp16, ds_fp32, ds_zero2"):
        locate("ds_bf17")


def test_resume_path_that_is_no_checkpoint_writes_nothing(capsys, tiny_model, sample_train, tmp_path):
    out = tmp_path / "out"
    code = main(["--model", str(tiny_model), "--train-file", str(sample_train), "--output-dir", str(out),
                 "--resume", str(tmp_path / "nothing-here")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "not a complete checkpoint" in err[0], err
    assert not out.exists()


def test_rng_state_loads_without_unpickling(tmp_path):
    """The per-rank RNG file holds tensors and plain values only: torch.load(weights_only=True) reads it."""
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    torch.save(_rng_state(), tmp_path / "rng.pt")
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    _set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


@pytest.mark.slow
def test_train_set_smaller_than_one_global_batch_trains(tiny_model, sample_train, tmp_path):
    doc = json.loads(sample_train.read_text())
    para = doc["data"][0]["paragraphs"][0]
    small = {"version": "1.1", "data": [{"title": "t", "paragraphs": [dict(para, qas=para["qas"][:2])]}]}
    train = tmp_path / "small.json"
    train.write_text(json.dumps(small))
    out = tmp_path / "out"
    r = run_bert_squad("--model", tiny_model, "--train-file", train, "--max-steps", 2,
                       "--output-dir", out, "--cache-dir", tmp_path / "c")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "fewer than one global batch of 16" in r.stdout
    assert json.loads((out / "train_metrics.json").read_text())["steps"] == 2


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
    r = run_bert_squad("--model", tiny_model, "--train-file", train, "--eval-file", dev, "--max-steps", 1,
                       "--max-seq-length", 96, "--doc-stride", 16, "--output-dir", tmp_path / "out",
                       "--cache-dir", tmp_path / "c")
    assert r.returncode == 0, r.stderr[-3000:]
    questions = {p: sum(len(para["qas"]) for a in json.loads(p.read_text())["data"] for para in a["paragraphs"])
                 for p in (train, dev)}
    assert (f"train {train}: {questions[train] - 2} questions" in r.stdout
            and "0 questions skipped (answer_start off its text), 2 skipped (empty question)" in r.stdout), r.stdout
    assert f"eval {dev}: {questions[dev] - 1} questions" in r.stdout and "1 skipped (empty question)" in r.stdout
    assert len(json.loads((tmp_path / "out" / "predictions.json").read_text())) == questions[dev] - 1
