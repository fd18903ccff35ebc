"""Every supported encoder family: train labels map back to exactly the answer's characters.

The property tests/test_features.py checks for BERT, for tiny models of each family (tests/tiny_models.py)
whose tokenizers are built like the real ones: WordPiece, byte-level BPE (offsets trimmed of the
leading space) and SentencePiece-style Unigram (Metaspace), each trained offline on the shipped sample.
"""

import json

import pytest
import torch
import transformers
from packaging.version import Version

from bert_squad.answer import Answerer
from bert_squad.config import WindowConfig
from bert_squad.data import read_squad
from bert_squad.features import build_features, feature_report
from helpers import MPIRUN, decode_spans, run_bert_squad
from tiny_models import FAMILIES, HIDDEN, LAYERS, build_tiny_model

pytestmark = pytest.mark.slow

# ModernBERT came with transformers 4.48; the oldest supported line (the compat run, 4.40) has the others.
HERE = [f for f in FAMILIES if f != "modernbert" or Version(transformers.__version__) >= Version("4.48")]


@pytest.fixture(scope="module", params=HERE)
def family_model(request, tmp_path_factory):
    return request.param, build_tiny_model(request.param, tmp_path_factory.mktemp(f"tiny-{request.param}"))


@pytest.mark.compat
def test_loads_fast_tokenizer_and_qa_model(family_model):
    from bert_squad.model import load_qa_model, load_tokenizer

    family, model_dir = family_model
    tok = load_tokenizer(model_dir)
    model = load_qa_model(model_dir)
    enc = tok(["Who?"], ["Ada wrote it."], return_tensors="pt")
    out = model(**enc)
    assert tok.is_fast and out.start_logits.shape == enc["input_ids"].shape
    assert tok.convert_ids_to_tokens(enc["input_ids"][0].tolist())[0] == tok.cls_token  # CLS labels "no answer"


@pytest.mark.compat
@pytest.mark.parametrize("win", [WindowConfig(384, 128, 64), WindowConfig(96, 32, 24)],
                         ids=["384-128", "96-32"])
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


def test_trains_evaluates_and_exports(family_model, sample_train, sample_dev, tmp_path):
    """One rank, a few steps: training, FLOPs and MFU from the family's model, evaluation and the export."""
    from bert_squad.perf import flops_per_sample, model_shape

    family, model_dir = family_model
    out = tmp_path / "out"
    r = run_bert_squad("--model", model_dir, "--train-file", sample_train, "--eval-file", sample_dev,
                       "--max-steps", 2, "--max-seq-length", 96, "--output-dir", out, "--cache-dir", tmp_path / "c",
                       "--peak-tflops", "0.5")
    assert r.returncode == 0, f"{family}: {r.stderr[-3000:]}"
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert metrics["steps"] == 2 and metrics["run_tflops_per_device"] > 0, (family, metrics)
    assert metrics["run_mfu"] == pytest.approx(metrics["run_tflops_per_device"] / 0.5)
    assert "f1" in json.loads((out / "eval_metrics.json").read_text())
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
    # Every family's FLOPs count its real parameters and its attention term.
    n, layers, hidden = model_shape(Answerer.from_pretrained(out).module)
    assert (layers, hidden) == (LAYERS, HIDDEN) and n > 4 * LAYERS * HIDDEN ** 2  # q, k, v, o alone
    assert flops_per_sample((n, layers, hidden), 96) > 6 * n * 96


@pytest.mark.mpi
def test_two_ranks_resume_and_answer(family_model, sample_train, tmp_path):
    """Two ranks (mpirun): a run resumed from the step-2 checkpoint of another ends with the same weights
    on every rank and the same weights as the uninterrupted run; the result answers questions."""
    from safetensors.torch import load_file

    from bert_squad.checkpoint import checkpoint_root

    family, model_dir = family_model
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    common = ["--model", model_dir, "--train-file", sample_train, "--max-steps", 4, "--max-seq-length", 96,
              "--no-eval", "--learning-rate", "1e-3", "--cache-dir", tmp_path / "c"]
    r = run_bert_squad(*common, "--output-dir", full, "--checkpoint-every", 2, launcher=MPIRUN)
    assert r.returncode == 0, f"{family}: {r.stderr[-3000:]}"
    step2 = checkpoint_root(full) / "step00000002"
    r = run_bert_squad(*common, "--output-dir", resumed, "--resume", step2, launcher=MPIRUN)
    assert r.returncode == 0 and f"resumed from {step2}" in r.stdout, f"{family}: {r.stderr[-3000:]}"
    metrics = json.loads((resumed / "train_metrics.json").read_text())
    assert metrics["world_size"] == 2 and len(set(metrics["weights_sha256_per_rank"])) == 1
    a, b = load_file(str(full / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), family
    context = "Ada Novak was born in Lugano in 1834. She studied physics at the university."
    for answer in Answerer.from_pretrained(resumed).answer("Where was Ada Novak born?", context, top_k=3):
        assert answer.text and context[answer.start:answer.end] == answer.text, (family, answer)
