"""From per-window start/end logits to one answer text per question.

Follows Hugging Face's `utils_qa.postprocess_qa_predictions` so that scores are comparable with
its `run_qa.py`: the best span over all windows of an example, among the top `n_best_size` starts
and ends of each window; for SQuAD 2.0 the null answer scores `start[CLS] + end[CLS]` (the lowest
over the windows) and wins when it beats the best span by more than `null_score_diff_threshold`.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any, NamedTuple, Optional

import numpy as np

Logits = Sequence[Any]  # per window, a 1-D array of per-token logits
Offsets = Sequence[Optional[Sequence[int]]]  # per token, [start_char, end_char] in the context, None outside it


class Candidate(NamedTuple):
    """One possible answer: a span of the context, or the null answer (no characters)."""

    score: float  # start_logit + end_logit
    start_char: int | None  # None for the null answer
    end_char: int | None
    start_logit: float
    end_logit: float


class Predictions(NamedTuple):
    """A model's answers to a set of questions: what evaluation scores and `bert-squad predict` writes."""

    predictions: dict[str, str]  # question id -> answer text ("" for no answer)
    nbest: dict[str, list[dict[str, Any]]]  # question id -> its n-best candidates, JSON-ready, best first
    null_odds: dict[str, float] | None  # SQuAD v2.0: null score minus the best span's (the v2.0 script's na_probs)


def _window_spans(offsets: Offsets, start: Any, end: Any, n_best_size: int, max_answer_length: int) -> list[Candidate]:
    """The allowed span candidates of one window.

    Only context tokens (offset not None) may bound a span, so a span never covers the question,
    CLS or padding; a span whose characters are empty is no answer.
    """
    start, end = np.asarray(start), np.asarray(end)
    if not len(start) == len(end) == len(offsets):
        raise ValueError(f"logits of length {len(start)}/{len(end)} for a window of {len(offsets)} tokens")
    in_context = np.array([o is not None for o in offsets], dtype=bool)
    # Pair the n best start tokens with the n best end tokens, then keep the well-formed pairs.
    top_starts = np.argsort(start, kind="stable")[::-1][:n_best_size]
    top_ends = np.argsort(end, kind="stable")[::-1][:n_best_size]
    s, e = np.meshgrid(top_starts, top_ends, indexing="ij")
    ok = in_context[s] & in_context[e] & (s <= e) & (e - s < max_answer_length)
    spans = []
    for i, j in zip(s[ok].tolist(), e[ok].tolist()):
        first, last = int(offsets[i][0]), int(offsets[j][1])
        if first < last:
            spans.append(Candidate(float(start[i] + end[j]), first, last, float(start[i]), float(end[j])))
    return spans


def _null_candidate(start_logits: Logits, end_logits: Logits, windows: list[int]) -> Candidate:
    """The null answer scores CLS's logits; of several windows the least confident one counts."""
    return min(
        (
            Candidate(
                float(start_logits[i][0] + end_logits[i][0]),
                None,
                None,
                float(start_logits[i][0]),
                float(end_logits[i][0]),
            )
            for i in windows
        ),
        key=lambda c: c.score,
    )


def _nbest_entries(candidates: list[Candidate], context: str) -> list[dict[str, Any]]:
    """JSON-ready n-best list, with a softmax over the candidates' scores.

    `offsets` ([start_char, end_char] in the context; None for the null answer) let a viewer mark the
    span where it is, not at the first occurrence of its text.
    """
    if not candidates:
        return []
    scores = np.array([c.score for c in candidates])
    probs = np.exp(scores - scores.max())
    probs /= probs.sum()
    return [
        {
            "text": "" if c.start_char is None else context[c.start_char : c.end_char],
            "offsets": None if c.start_char is None else [c.start_char, c.end_char],
            "start_logit": c.start_logit,
            "end_logit": c.end_logit,
            "probability": float(p),
        }
        for c, p in zip(candidates, probs)
    ]


def _best_spans(
    features: Sequence[dict[str, Any]],
    start_logits: Logits,
    end_logits: Logits,
    windows: list[int],
    n_best_size: int,
    max_answer_length: int,
) -> list[Candidate]:
    """The `n_best_size` best spans over all windows of one question, best first; the offsets of every
    window are characters of the one context, so spans of different windows compare directly."""
    spans = [
        span
        for i in windows
        for span in _window_spans(
            features[i]["offset_mapping"], start_logits[i], end_logits[i], n_best_size, max_answer_length
        )
    ]
    return sorted(spans, key=lambda span: span.score, reverse=True)[:n_best_size]


def predicted_entry(prediction: str, nbest: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The n-best entry that is the prediction. With a null threshold it need not be the first: a span
    may be predicted although the null answer scores best, or "no answer" although a span scores best."""
    return next((e for e in nbest if e["text"] == prediction), None)


def postprocess_predictions(
    examples: Sequence[dict[str, Any]],
    features: Sequence[dict[str, Any]],
    start_logits: Logits,
    end_logits: Logits,
    *,
    version_2_with_negative: bool = False,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    null_score_diff_threshold: float = 0.0,
) -> Predictions:
    """Each question's answer text, its n-best list and (SQuAD v2.0) its null odds.

    `features[i]` has `example_id` and `offset_mapping` (`[start_char, end_char]` per context token,
    None for the rest, CLS first); `start_logits[i]`/`end_logits[i]` are 1-D arrays as long as it.
    With no allowed span the prediction is "" (v2.0: null odds taken against a span score of 0).
    """
    # A long context was cut into several windows (features): collect each question's windows.
    windows: dict[str, list[int]] = collections.defaultdict(list)
    for i, feature in enumerate(features):
        windows[feature["example_id"]].append(i)
    predictions: dict[str, str] = {}
    nbest: dict[str, list[dict[str, Any]]] = {}
    null_odds: dict[str, float] | None = {} if version_2_with_negative else None
    for example in examples:
        qid, context = example["id"], example["context"]
        if not windows[qid]:
            raise ValueError(f"example {qid} has no features")
        spans = _best_spans(features, start_logits, end_logits, windows[qid], n_best_size, max_answer_length)
        best_text = context[spans[0].start_char : spans[0].end_char] if spans else ""
        if not version_2_with_negative:
            predictions[qid] = best_text
            nbest[qid] = _nbest_entries(spans, context)
            continue
        # SQuAD 2.0: answer "" when the null answer beats the best span by more than the threshold.
        assert null_odds is not None
        null = _null_candidate(start_logits, end_logits, windows[qid])
        null_odds[qid] = null.score - (spans[0].score if spans else 0.0)
        predictions[qid] = "" if null_odds[qid] > null_score_diff_threshold else best_text
        # The null answer always appears in the n-best list, even when it ranks below n_best_size.
        candidates = sorted([*spans, null], key=lambda c: c.score, reverse=True)[:n_best_size]
        if null not in candidates:
            candidates.append(null)
        nbest[qid] = _nbest_entries(candidates, context)
    return Predictions(predictions, nbest, null_odds)
