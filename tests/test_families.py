"""Every supported encoder family: train labels map back to exactly the answer's characters.

The property tests/test_features.py checks for BERT, for tiny models of each family (tests/tiny_models.py)
whose tokenizers are built like the real ones: WordPiece, byte-level BPE (offsets trimmed of the
leading space) and SentencePiece-style Unigram (Metaspace), each trained offline on the shipped sample.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import transformers
from helpers import (
    PYTHON,
    assert_same_weights,
    decode_spans,
    inference_args,
    run_bert_squad,
    run_ranks_by_hand,
    train_args,
)
from packaging.version import Version
from tiny_models import FAMILIES, HIDDEN, LAYERS, LONG

from bert_squad.answer import Answerer
from bert_squad.config import WindowConfig
from bert_squad.data import read_squad
from bert_squad.features import build_features, feature_report
from bert_squad.model import FAMILIES as KNOWN

pytestmark = [pytest.mark.slow, pytest.mark.heavy]


def here(known):
    """Whether this transformers has the family's class (model.FAMILIES): the oldest supported line (the compat
    run, 4.40) has all but ModernBERT's (4.51) and EuroBERT's (5.3)."""
    return known.since is None or Version(transformers.__version__) >= Version(known.since)


HERE = [f for f in FAMILIES if here({k.name.lower(): k for k in KNOWN}[f])]  # tiny_models names them so
# Families transformers has no question-answering class for: the project's span head goes on their encoder.
SPAN_HEAD = {f.name.lower() for f in KNOWN if not f.loads.endswith("ForQuestionAnswering")}
# Loads an export in a fresh process with transformers alone, as a user without bert_squad would.
ALONE = """
import json, sys, torch
from transformers import AutoModelForQuestionAnswering, AutoTokenizer
model = AutoModelForQuestionAnswering.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
enc = AutoTokenizer.from_pretrained(sys.argv[1])(sys.argv[2], sys.argv[3], return_tensors="pt")
with torch.no_grad():
    start = model(**enc).start_logits[0].tolist()
print(json.dumps({"class": type(model).__name__, "bert_squad": any(m.startswith("bert_squad") for m in sys.modules),
                  "start": start}))
"""


@pytest.mark.compat
@pytest.mark.parametrize("known", KNOWN, ids=lambda f: f.name)
def test_a_family_newer_than_transformers_is_refused_naming_its_release(
    known, tiny_model, sample_train, tmp_path, capsys
):
    """Below the first release whose wheel has the class the project loads for a family (model.FAMILIES), a
    model of it is refused in one line naming that release (exit 2, nothing written); from it on, the check
    lets it through to the loaders (the tests below load each family)."""
    from bert_squad import cli
    from bert_squad.model import family, load_tokenizer

    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model, model_dir)  # the tiny BERT's tokenizer, with a config of the family
    if here(known):
        transformers.AutoConfig.for_model(known.model_type).save_pretrained(model_dir)
        assert load_tokenizer(model_dir).is_fast
        return
    (model_dir / "config.json").write_text(json.dumps({"model_type": known.model_type}))
    code = cli.main(
        train_args(model_dir, sample_train, tmp_path / "out", "--max-steps", 1, cache=tmp_path / "cache", windows=[])
    )
    err = capsys.readouterr().err.strip().splitlines()
    first = family(known.model_type)  # mmBERT is a ModernBERT, mDeBERTa-v3 a DeBERTa-v3: named by the first
    assert code == 2 and err == [
        f"bert-squad: error: {model_dir}: a {first.name} model ({known.model_type}) needs "
        f"transformers >= {known.since}, the first release with {known.loads}; this is "
        f"transformers {transformers.__version__} (docs/models.md)"
    ], err
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module", params=HERE)
def family_model(request, tiny_family):
    return request.param, tiny_family(request.param)


@pytest.mark.compat
def test_loads_fast_tokenizer_and_qa_model(family_model):
    from bert_squad.model import load_qa_model, load_tokenizer

    _family, model_dir = family_model
    tok = load_tokenizer(model_dir)
    model = load_qa_model(model_dir)
    enc = tok(["Who?"], ["Ada wrote it."], return_tensors="pt")
    out = model(**enc)
    assert tok.is_fast and out.start_logits.shape == enc["input_ids"].shape
    first = tok.convert_ids_to_tokens(enc["input_ids"][0].tolist())[0]
    assert first == (tok.cls_token or tok.bos_token)  # CLS (EuroBERT: begin-of-text) labels "no answer"


@pytest.mark.compat
@pytest.mark.parametrize("win", [WindowConfig(384, 128, 64), WindowConfig(96, 32, 24)], ids=["384-128", "96-32"])
def test_sample_labels_map_back_to_answers(family_model, sample_train, win):
    from bert_squad.model import load_tokenizer

    family, model_dir = family_model
    tok = load_tokenizer(model_dir)
    examples = read_squad(sample_train)
    features = build_features(examples, tok, win, cache_dir=None, train=True)
    spans = decode_spans(examples, tok, win, features)
    wrong = [(ex["id"], ex["answers"]["text"][0], text) for ex, text in spans if text != ex["answers"]["text"][0]]
    assert spans and not wrong, f"{family}: {len(wrong)} of {len(spans)} labels decode to other text: {wrong[:5]}"
    report = feature_report(examples, features)
    assert report["answers_in_no_window"] == 0, (family, report)
    assert len({ex["id"] for ex, _ in spans}) == report["answerable"] == len(examples)


WINDOW = ["--max-seq-length", 96]  # the other window options as the CLI's defaults


def test_two_ranks_train_evaluate_export_resume_and_answer(family_model, sample_train, sample_dev, tmp_path):
    """Two ranks (started by hand as a launcher starts them: mpirun's own tests are test_train's), a few steps:
    training, FLOPs and MFU from the family's model, distributed evaluation, the export, and `predict` from it
    answering as the evaluation did; a run resumed from the step-2 checkpoint ends with the same weights on
    every rank and as the uninterrupted run, and it answers questions."""
    from bert_squad.checkpoint import checkpoint_root
    from bert_squad.perf import flops_per_sample, model_shape

    family, model_dir = family_model
    full, resumed = tmp_path / "full", tmp_path / "resumed"

    def run(out, *extra):
        steps = ["--max-steps", 4, "--learning-rate", "1e-3", *extra]
        args = train_args(model_dir, sample_train, out, *steps, cache=tmp_path / "c", windows=WINDOW)
        return run_ranks_by_hand(*args, folder=tmp_path / f"{out.name}-ranks")

    r = run(full, "--eval-file", sample_dev, "--checkpoint-every", 2, "--peak-tflops", "0.5")
    assert r.returncode == 0, f"{family}: {r.stderr[-3000:]}"
    metrics = json.loads((full / "train_metrics.json").read_text())
    assert metrics["steps"] == 4 and metrics["run_tflops_per_device"] > 0, (family, metrics)
    assert metrics["run_mfu"] == pytest.approx(metrics["run_tflops_per_device"] / 0.5)
    assert "f1" in json.loads((full / "eval_metrics.json").read_text())
    assert (full / "model.safetensors").exists() and (full / "tokenizer.json").exists()
    # `predict` from the export, in one process, answers as the run's evaluation on two ranks did, byte for byte.
    predicted = run_bert_squad(
        *inference_args("predict", full, sample_dev, tmp_path / "predicted", cache=tmp_path / "c", windows=WINDOW)
    )
    assert predicted.returncode == 0, f"{family}: {predicted.stderr[-3000:]}"
    assert (tmp_path / "predicted" / "predictions.json").read_bytes() == (full / "predictions.json").read_bytes()
    # Every family's FLOPs count its real parameters and its attention term.
    n, layers, hidden = model_shape(Answerer.from_pretrained(full).module)
    assert (layers, hidden) == (LAYERS, HIDDEN) and n > 4 * LAYERS * HIDDEN**2  # q, k, v, o alone
    assert flops_per_sample((n, layers, hidden), 96) > 6 * n * 96
    if family in SPAN_HEAD:  # the checkpoint's masked-LM head is left out, in one line; the export loads alone
        assert sum("left out: lm_head" in line for line in r.stdout.splitlines()) == 1, r.stdout
        assert_loads_with_transformers_alone(full, tmp_path)
    step2 = checkpoint_root(full) / "step00000002"
    r = run(resumed, "--no-eval", "--resume", step2)
    assert r.returncode == 0 and f"resumed from {step2}" in r.stdout, f"{family}: {r.stderr[-3000:]}"
    metrics = json.loads((resumed / "train_metrics.json").read_text())
    assert metrics["world_size"] == 2 and len(set(metrics["weights_sha256_per_rank"])) == 1
    assert_same_weights(full, resumed)
    context = "Ada Novak was born in Lugano in 1834. She studied physics at the university."
    for answer in Answerer.from_pretrained(resumed).answer("Where was Ada Novak born?", context, top_k=3):
        assert answer.text and context[answer.start : answer.end] == answer.text, (family, answer)


def assert_loads_with_transformers_alone(out: Path, tmp_path: Path) -> None:
    """The export of a model with the project's span head: its config names the modelling file beside the
    weights, which transformers alone (no bert_squad imported) loads to the same logits as the project."""
    question, context = "Where was Ada Novak born?", "Ada Novak was born in Lugano in 1834."
    r = subprocess.run(
        [PYTHON, "-c", ALONE, str(out), question, context],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules")},
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    alone = json.loads(r.stdout.strip().splitlines()[-1])
    qa = Answerer.from_pretrained(out)
    enc = qa.tokenizer(question, context, return_tensors="pt")
    with torch.no_grad():
        ours = qa.module(**enc).start_logits[0]
    assert alone["class"] == type(qa.module).__name__ and alone["class"].endswith("ForQuestionAnswering")
    assert not alone["bert_squad"] and torch.allclose(torch.tensor(alone["start"]), ours, atol=1e-5)


# What limits a window: learned position embeddings (RoBERTa's and XLM-R's 514 less the 2 they reserve), or
# max_position_embeddings where positions are relative (DeBERTa) or rotary (ModernBERT, EuroBERT).
RELATIVE_OR_ROTARY = ("deberta-v3", "mdeberta-v3", *LONG)


def test_windows_go_up_to_the_models_own_positions(family_model, sample_train, sample_dev, tmp_path, capsys):
    """--max-seq-length one past the model's positions is refused in one line naming the model's limit (exit 2,
    nothing written); ModernBERT and EuroBERT train and evaluate at 8,192 tokens, one window per context, even
    where their tokenizer's model_max_length says 512: the limit is the model's own."""
    from bert_squad import cli

    family, model_dir = family_model
    limit = 8192 if family in LONG else 512
    too_long = ["--max-seq-length", str(limit + 1)]
    code = cli.main(
        train_args(model_dir, sample_train, tmp_path / "no", "--max-steps", 1, cache=tmp_path / "c", windows=too_long)
    )
    source = "max_position_embeddings" if family in RELATIVE_OR_ROTARY else "position embeddings"
    assert code == 2 and capsys.readouterr().err.strip().splitlines() == [
        f"bert-squad: error: --max-seq-length {limit + 1}: {model_dir} takes at most {limit} tokens (its {source})"
    ]
    assert not (tmp_path / "no").exists()
    if family not in LONG:
        return
    short_tokenizer = tmp_path / "model"
    shutil.copytree(model_dir, short_tokenizer)
    config_file = short_tokenizer / "tokenizer_config.json"
    config_file.write_text(json.dumps(dict(json.loads(config_file.read_text()), model_max_length=512)))
    out = tmp_path / "out"
    steps = ["--eval-file", sample_dev, "--max-steps", 1]
    r = run_bert_squad(
        *train_args(
            short_tokenizer, sample_train, out, *steps, cache=tmp_path / "c", windows=["--max-seq-length", limit]
        )
    )
    assert r.returncode == 0, f"{family}: {r.stderr[-3000:]}"
    counts = json.loads((out / "train_metrics.json").read_text())["features"]
    assert counts["features"] == counts["examples"] == len(read_squad(sample_train)), counts  # one window each
    assert (
        f"eval {sample_dev}: {len(read_squad(sample_dev))} questions, {len(read_squad(sample_dev))} features"
        in r.stdout
    )
