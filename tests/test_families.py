"""Every supported encoder family: train labels map back to exactly the answer's characters.

The property tests/test_features.py checks for BERT, for tiny models of each family (tests/tiny_models.py)
whose tokenizers are built like the real ones: WordPiece, byte-level BPE (offsets trimmed of the
leading space) and SentencePiece-style Unigram (Metaspace), each trained offline on the shipped sample.
"""

import pytest

from bert_squad.data import read_squad
from bert_squad.config import WindowConfig
from bert_squad.features import build_features, feature_report
from test_features import _decode_spans
from tiny_models import FAMILIES, build_tiny_model

pytestmark = pytest.mark.slow

@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request, tmp_path_factory):
    return request.param, build_tiny_model(request.param, tmp_path_factory.mktemp(f"tiny-{request.param}"))


def test_loads_fast_tokenizer_and_qa_model(family_model):
    from bert_squad.model import load_qa_model, load_tokenizer

    family, model_dir = family_model
    tok = load_tokenizer(model_dir)
    model = load_qa_model(model_dir)
    enc = tok(["Who?"], ["Ada wrote it."], return_tensors="pt")
    out = model(**enc)
    assert tok.is_fast and out.start_logits.shape == enc["input_ids"].shape
    assert tok.convert_ids_to_tokens(enc["input_ids"][0].tolist())[0] == tok.cls_token  # CLS labels "no answer"


@pytest.mark.parametrize("win", [WindowConfig(384, 128, 64), WindowConfig(96, 32, 24)],
                         ids=["384-128", "96-32"])
def test_sample_labels_map_back_to_answers(family_model, sample_train, win):
    from bert_squad.model import load_tokenizer

    family, model_dir = family_model
    tok = load_tokenizer(model_dir)
    examples = read_squad(sample_train)
    features = build_features(examples, tok, win, cache_dir=None, train=True)
    spans = _decode_spans(examples, tok, win, features)
    wrong = [(ex["id"], ex["answers"]["text"][0], text) for ex, text in spans if text != ex["answers"]["text"][0]]
    assert spans and not wrong, f"{family}: {len(wrong)} of {len(spans)} labels decode to other text: {wrong[:5]}"
    report = feature_report(examples, features)
    assert report["answers_in_no_window"] == 0, (family, report)
    assert len({ex["id"] for ex, _ in spans}) == report["answerable"] == len(examples)


def test_trains_evaluates_and_exports(family_model, sample_train, sample_dev, tmp_path):
    """One rank, a few steps: training, FLOPs from the family's config, evaluation and the export."""
    import json

    from conftest import run_bert_squad

    family, model_dir = family_model
    out = tmp_path / "out"
    r = run_bert_squad("--model", model_dir, "--train-file", sample_train, "--eval-file", sample_dev,
                       "--max-steps", 2, "--max-seq-length", 96, "--output-dir", out, "--cache-dir", tmp_path / "c")
    assert r.returncode == 0, f"{family}: {r.stderr[-3000:]}"
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert metrics["steps"] == 2 and metrics["run_tflops_per_device"] > 0, (family, metrics)
    assert "f1" in json.loads((out / "eval_metrics.json").read_text())
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
