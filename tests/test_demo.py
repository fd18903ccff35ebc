"""`make demo`'s recipe learns the task: it trains MiniLM-L6 on the shipped sample as the Makefile does, and
its dev F1 stays above a floor, so a change to what training computes cannot lower it unseen. The README's next
steps on its model, `evaluate` and `bert-squad-test` with no window option, give the run's own answers. Its
model also evaluates in bf16 autocast within half a point of fp32, as a training run's evaluation does on a GPU: on the
first 12 questions of the dev set, since a CPU without bf16 instructions emulates it (the whole dev set took 10x
fp32's time here, at the same F1: docs/performance.md). tests/run.sh runs this session last, with two threads."""

import json
import shlex
import subprocess

import pytest
import torch
from helpers import ROOT, run_bert_squad

from bert_squad import evaluate, model
from bert_squad.config import PostprocessConfig, parse_run_config
from bert_squad.data import Examples, read_squad
from bert_squad.features import build_features

pytestmark = [pytest.mark.slow, pytest.mark.demo]

# The recipe's dev F1 at every seed measured, on one thread and on two, is at least this (docs/performance.md:
# make demo's recipe); a change to what training computes that lowers it fails here.
F1_FLOOR = 95.0
BF16_QUESTIONS = 12  # the dev questions evaluated both ways (36 windows)


def _make(target):
    done = subprocess.run(["make", "-s", target], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60)
    return done.stdout.strip()


def test_the_demo_recipe_learns_the_sample_and_evaluates_alike_in_bf16(tmp_path):
    command = ["--model", _make("minilm-dir"), *shlex.split(_make("demo-args"))]
    out, cache = tmp_path / "demo", tmp_path / "cache"
    r = run_bert_squad(*command, "--output-dir", out, "--cache-dir", cache, timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]
    fp32 = json.loads((out / "eval_metrics.json").read_text())
    assert fp32["f1"] >= F1_FLOOR, fp32
    ran = json.loads((out / "predictions.json").read_text())

    # the README's step 3 and 4 on the demo's model: its windows and answer rules are the model's own
    dev_file = parse_run_config(command).data.eval_file
    r = run_bert_squad("evaluate", "--model-dir", out, "--eval-file", dev_file, "--output-dir", tmp_path / "ev")
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.splitlines()[-1]) == {k: fp32[k] for k in ("exact_match", "f1")}
    assert json.loads((tmp_path / "ev" / "predictions.json").read_text()) == ran
    r = run_bert_squad("test", "--model-dir", out, "--eval-file", dev_file, "--num-test-samples", 20, "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    assert {q["id"]: q["prediction"] for q in json.loads(r.stdout)} == {q: ran[q] for q in list(ran)[:20]}

    # the exported model in-process, fp32 and under bf16 autocast, over the demo's dev windows: the recipe parsed
    # as the run parsed it, so its windows are the run's
    run = parse_run_config(command)
    module, tokenizer = model.load_qa_model(out), model.load_tokenizer(out)
    dev = read_squad(run.data.eval_file)
    examples = Examples(dev.records[:BF16_QUESTIONS], dev.source, dev.version_2)
    features = build_features(examples, tokenizer, run.windows, cache, train=False)
    f1 = {}
    for dtype in (None, torch.bfloat16):
        result = evaluate.predict(
            module, examples, features, torch.device("cpu"), tokenizer.pad_token_id, PostprocessConfig(), autocast=dtype
        )
        f1[dtype] = evaluate.score_predictions(result, examples, None)["f1"]
        if dtype is None:  # the same evaluation as the run's own: its answers to these questions
            assert result[0] == {qid: ran[qid] for qid in result[0]}, result[0]
    assert abs(f1[torch.bfloat16] - f1[None]) <= 0.5, f1
