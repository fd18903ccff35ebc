"""Every supported encoder family: train labels map back to exactly the answer's characters.

The property tests/test_features.py checks for BERT, for tiny models of each family (tests/tiny_models.py)
whose tokenizers are built like the real ones: WordPiece, byte-level BPE (offsets trimmed of the
leading space) and SentencePiece-style Unigram (Metaspace), each trained offline on the shipped sample.
"""

import pytest

from bert_squad.data import read_squad
from bert_squad.features import WindowConfig, build_features, feature_report
from test_features import _decode_spans
from tiny_models import FAMILIES, build_tiny_model

pytestmark = pytest.mark.slow

# (family, max_seq_length) whose labels bert_squad/features.py gets wrong today, and why. The fix
# (features._tokenize: trim whitespace off each context token's offsets before labelling) makes all pass.
KNOWN_LABEL_FAILURES = {
    ("deberta-v3", 384): "Metaspace offsets include the space before a word: labels decode to ' answer'",
    ("deberta-v3", 96): "Metaspace offsets include the space before a word: labels decode to ' answer'",
    ("modernbert", 96): "the first token of an overflow window keeps its leading space (byte-level BPE)",
}


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
def test_sample_labels_map_back_to_answers(family_model, sample_train, win, request):
    from bert_squad.model import load_tokenizer

    family, model_dir = family_model
    known = KNOWN_LABEL_FAILURES.get((family, win.max_seq_length))
    if known:
        request.applymarker(pytest.mark.xfail(strict=True, reason=known))
    tok = load_tokenizer(model_dir)
    examples = read_squad(sample_train)
    features = build_features(examples, tok, win, cache_dir=None, train=True)
    spans = _decode_spans(examples, tok, win, features)
    wrong = [(ex["id"], ex["answers"]["text"][0], text) for ex, text in spans if text != ex["answers"]["text"][0]]
    assert spans and not wrong, f"{family}: {len(wrong)} of {len(spans)} labels decode to other text: {wrong[:5]}"
    report = feature_report(examples, features)
    assert report["answers_in_no_window"] == 0, (family, report)
    assert len({ex["id"] for ex, _ in spans}) == report["answerable"] == len(examples)
