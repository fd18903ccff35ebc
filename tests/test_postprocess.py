"""bert_squad.postprocess on hand-built windows whose right answer is known."""

import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bert_squad.postprocess import postprocess_predictions

CONTEXT = "The quick brown fox jumps over the lazy dog."
WORDS = [[m.start(), m.end()] for m in re.finditer(r"\S+", CONTEXT)]  # 9 words, one token each
QUESTION_TOKENS = 3


def window(first, last, pad=0):
    """Offsets of [CLS] question [SEP] words[first:last] [SEP] padding."""
    return [None] * (1 + QUESTION_TOKENS + 1) + WORDS[first:last] + [None] * (1 + pad)


def token(first, word):
    """Index of context word `word` in a window starting at word `first`."""
    return 1 + QUESTION_TOKENS + 1 + word - first


def logits(offsets, marks):
    """Low logits everywhere, `marks` (token index -> value) on top."""
    values = np.full(len(offsets), -10.0, dtype=np.float32)
    for index, value in marks.items():
        values[index] = value
    return values


def run(windows, starts, ends, **kwargs):
    features = [{"example_id": "q", "offset_mapping": w} for w in windows]
    examples = [{"id": "q", "context": CONTEXT, "title": "ignored"}]
    return postprocess_predictions(examples, features, starts, ends, **kwargs)


def two_windows():
    """Words 0-5 and 3-8, of different lengths (the second is padded)."""
    return [window(0, 6), window(3, 9, pad=4)]


def test_best_span_over_overlapping_windows_and_never_from_the_question():
    a, b = two_windows()
    starts = [
        logits(a, {1: 50.0, token(0, 1): 2.0}),  # question token 1 is a decoy
        logits(b, {2: 50.0, token(3, 7): 5.0}),
    ]
    ends = [logits(a, {2: 50.0, token(0, 2): 2.0}), logits(b, {3: 50.0, token(3, 8): 5.0})]
    preds, nbest, null_odds = run([a, b], starts, ends)
    assert preds == {"q": "lazy dog."}
    assert preds["q"] == CONTEXT[WORDS[7][0] : WORDS[8][1]]
    assert null_odds is None
    top = nbest["q"][0]
    assert top["text"] == "lazy dog." and (top["start_logit"], top["end_logit"]) == (5.0, 5.0)
    assert top["offsets"] == [WORDS[7][0], WORDS[8][1]]
    assert [e["text"] for e in nbest["q"]].count("quick brown") == 1
    assert sum(e["probability"] for e in nbest["q"]) == pytest.approx(1.0)
    json.dumps(nbest)  # plain floats


def test_max_answer_length_and_start_before_end():
    w = window(0, 9)
    starts = [logits(w, {token(0, 5): 9.0, token(0, 1): 8.0})]
    ends = [logits(w, {token(0, 2): 9.0, token(0, 8): 9.5})]
    # Higher pairs than "quick brown" (1-2): 5-2 ends before it starts; 5-8 is 4 words, 1-8 is 8.
    preds, nbest, _ = run([w], starts, ends, max_answer_length=3)
    assert preds["q"] == "quick brown"
    assert all(len(e["text"].split()) <= 3 for e in nbest["q"])
    assert run([w], starts, ends, max_answer_length=4)[0]["q"] == "over the lazy dog."


def test_n_best_size_limits_candidates():
    w = window(0, 9)
    rng = np.random.default_rng(0)
    start, end = rng.normal(size=len(w)).astype(np.float32), rng.normal(size=len(w)).astype(np.float32)
    _, nbest, _ = run([w], [start], [end], n_best_size=3)
    assert 1 <= len(nbest["q"]) <= 3
    scores = [e["start_logit"] + e["end_logit"] for e in nbest["q"]]
    assert scores == sorted(scores, reverse=True)


def test_v2_null_answer_and_threshold():
    a, b = two_windows()
    # Null score: min over windows of start[CLS] + end[CLS] = 1 + 1 (window b), span "fox" = 1.5 + 1.5.
    starts = [logits(a, {0: 6.0, token(0, 3): 1.5}), logits(b, {0: 1.0})]
    ends = [logits(a, {0: 6.0, token(0, 3): 1.5}), logits(b, {0: 1.0})]
    preds, nbest, null_odds = run([a, b], starts, ends, version_2_with_negative=True)
    assert null_odds == {"q": pytest.approx(2.0 - 3.0)}
    assert preds["q"] == "fox"
    assert {"text": "", "offsets": None, "start_logit": 1.0, "end_logit": 1.0} in [
        {k: e[k] for k in ("text", "offsets", "start_logit", "end_logit")} for e in nbest["q"]
    ]
    assert run([a, b], starts, ends, version_2_with_negative=True, null_score_diff_threshold=-1.5)[0]["q"] == ""


def test_v2_null_answer_stays_in_a_full_nbest():
    a, b = two_windows()
    marks = {0: -5.0, token(0, 3): 2.0, token(0, 4): 1.0}
    both = [logits(a, marks), logits(b, {})]
    preds, nbest, null_odds = run([a, b], both, both, version_2_with_negative=True, n_best_size=2)
    assert [e["text"] for e in nbest["q"]] == ["fox", "fox jumps", ""]
    assert [e["offsets"] for e in nbest["q"]] == [WORDS[3], [WORDS[3][0], WORDS[4][1]], None]
    assert null_odds["q"] == -20.0 - 4.0 and preds["q"] == "fox"


@pytest.mark.parametrize("v2", [False, True])
def test_no_valid_span_predicts_empty(v2):
    w = window(0, 2)
    starts = [logits(w, {token(0, 1): 5.0, token(0, 0): -20.0})]
    ends = [logits(w, {token(0, 0): 5.0, token(0, 1): -20.0})]
    preds, nbest, null_odds = run([w], starts, ends, version_2_with_negative=v2, n_best_size=1)
    assert preds == {"q": ""}
    assert [e["text"] for e in nbest["q"]] == ([""] if v2 else [])
    assert (null_odds is None) != v2


def test_logits_must_match_the_window():
    w = window(0, 3)
    with pytest.raises(ValueError, match="window of 9 tokens"):
        run([w], [np.zeros(8)], [np.zeros(8)])


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_prediction_is_the_best_allowed_span(data):
    """With n_best_size covering every token, the choice equals a brute-force search."""
    windows = [
        window(f, f + n, pad=data.draw(st.integers(0, 3)))
        for f, n in data.draw(st.lists(st.tuples(st.integers(0, 8), st.integers(1, 9)), min_size=1, max_size=3))
    ]
    values = st.integers(-4, 4).map(float)  # small integers: ties, and exact sums
    starts = [np.array(data.draw(st.lists(values, min_size=len(w), max_size=len(w)))) for w in windows]
    ends = [np.array(data.draw(st.lists(values, min_size=len(w), max_size=len(w)))) for w in windows]
    max_len = data.draw(st.integers(1, 4))
    preds, nbest, _ = run(windows, starts, ends, n_best_size=100, max_answer_length=max_len)
    best = max(
        (
            s[i] + e[j]
            for w, s, e in zip(windows, starts, ends)
            for i in range(len(w))
            for j in range(i, min(i + max_len, len(w)))
            if w[i] is not None and w[j] is not None
        ),
        default=None,
    )
    if best is None:
        assert preds["q"] == "" and nbest["q"] == []
        return
    assert nbest["q"][0]["start_logit"] + nbest["q"][0]["end_logit"] == best
    assert preds["q"] == nbest["q"][0]["text"]
    spans = {CONTEXT[a[0] : b[1]] for w in windows for a in w for b in w if a and b and a[0] < b[1]}
    assert all(e["text"] in spans for e in nbest["q"])
    assert all(e["text"] == CONTEXT[slice(*e["offsets"])] for e in nbest["q"])


def test_offsets_mark_the_chosen_occurrence_of_a_repeated_text():
    """A viewer must highlight the "dog" the model picked, not the first one in the paragraph."""
    offsets = [None, None, [0, 3], [4, 9], [10, 13], None]  # [CLS] q [SEP] dog bites dog [SEP]
    marks = logits(offsets, {4: 9.0})
    preds, nbest, _ = postprocess_predictions(
        [{"id": "q", "context": "dog bites dog"}], [{"example_id": "q", "offset_mapping": offsets}], [marks], [marks]
    )
    assert preds["q"] == "dog" and nbest["q"][0]["offsets"] == [10, 13]
