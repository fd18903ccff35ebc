"""SQuAD metrics, defined exactly as the official evaluation scripts define them.

Published numbers are computed with `evaluate-v1.1.py` and `evaluate-v2.0.py`, so the scores here
follow them operation for operation (same normalisation, same summation order, same rounding):
the JSON our CLI prints is the JSON the official script prints for the same inputs.

The two scripts differ in small ways that are kept on purpose:
- v1.1 scores a missing prediction 0 (message on stderr); v2.0 cannot score without one
  (the official script crashes), so `score_v2` raises `ValueError` naming the missing ids.
- v2.0 drops reference answers that normalise to nothing and treats "no reference" as the single
  reference "", whose only match is an empty prediction; v1.1 keeps every reference.
- v2.0's F1 is 1 when prediction and reference are both empty; v1.1's is 0.

Every function takes `lang`: None keeps the SQuAD scripts' English normalization; a language code of
`LANGUAGES` uses MLQA's published per-language rules instead (see `normalize_answer`).
"""

from __future__ import annotations

import collections
import re
import string
import sys
import unicodedata
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

from bert_squad.squad import is_squad_v2

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)

# MLQA's rules (Lewis et al., 2020): the words each language drops as articles (Hindi and Chinese have none;
# Arabic's article is the prefix al-, removed wherever it occurs, as MLQA's script does).
_MLQA_ARTICLES = {
    "en": ["a", "an", "the"],
    "es": ["un", "una", "unos", "unas", "el", "la", "los", "las"],
    "de": ["ein", "eine", "einen", "einem", "eines", "einer", "der", "die", "das", "den", "dem", "des"],
    "vi": ["của", "là", "cái", "chiếc", "những"],
    "hi": [],
    "zh": [],
}
_MLQA_PREFIXES = {"ar": "\u0627\u0644"}  # ال
LANGUAGES = tuple(sorted([*_MLQA_ARTICLES, *_MLQA_PREFIXES]))
_SEGMENTED = {"zh"}  # scored per character of CJK text (MLQA's mixed segmentation), not per whitespace token
_CJK = re.compile("[\u4e00-\u9fa5]")
_UNICODE_PUNCTUATION: frozenset[str] | None = None  # every Unicode P* code point, with ASCII's: built on first use
Articles = list[dict[str, Any]]  # the official format's `data` list


def _unicode_punctuation() -> frozenset[str]:
    global _UNICODE_PUNCTUATION
    if _UNICODE_PUNCTUATION is None:
        _UNICODE_PUNCTUATION = _PUNCTUATION | frozenset(
            c for c in map(chr, range(sys.maxunicode)) if unicodedata.category(c).startswith("P")
        )
    return _UNICODE_PUNCTUATION


def _segments(text: str) -> list[str]:
    """Mixed segmentation: each CJK character or punctuation mark a token, other runs split at whitespace."""
    tokens: list[str] = []
    run: list[str] = []
    punctuation = _unicode_punctuation()
    for ch in text:
        if _CJK.match(ch) or ch in punctuation:
            tokens += [*"".join(run).split(), ch]
            run = []
        else:
            run.append(ch)
    return tokens + "".join(run).split()


def _mlqa_normalize(text: str, lang: str) -> str:
    punctuation = _unicode_punctuation()
    text = "".join(ch for ch in text.lower() if ch not in punctuation)
    if _MLQA_ARTICLES.get(lang):
        text = re.sub(r"\b(" + "|".join(_MLQA_ARTICLES[lang]) + r")\b", " ", text)
    if lang in _MLQA_PREFIXES:
        text = text.replace(_MLQA_PREFIXES[lang], " ")
    tokens = _segments(text) if lang in _SEGMENTED else text.split()
    return " ".join(t for t in tokens if t.strip())


def normalize_answer(text: str, lang: str | None = None) -> str:
    """SQuAD's (lang None): lowercase, drop ASCII punctuation and the articles a/an/the, collapse whitespace.
    MLQA's for `lang`: lowercase, drop Unicode punctuation and the language's articles, then whitespace tokens
    (zh: mixed segmentation), joined by single spaces."""
    if lang is None:
        text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
        return " ".join(_ARTICLES.sub(" ", text).split())
    return _mlqa_normalize(text, lang)


def _exact(prediction: str, reference: str, lang: str | None = None) -> float:
    return float(normalize_answer(prediction, lang) == normalize_answer(reference, lang))


def _f1(prediction: str, reference: str, empty_matches_empty: bool, lang: str | None = None) -> float:
    pred_toks = normalize_answer(prediction, lang).split()
    gold_toks = normalize_answer(reference, lang).split()
    if empty_matches_empty and (not pred_toks or not gold_toks):
        return float(pred_toks == gold_toks)
    num_same = sum((collections.Counter(pred_toks) & collections.Counter(gold_toks)).values())
    if num_same == 0:
        return 0.0
    precision = 1.0 * num_same / len(pred_toks)
    recall = 1.0 * num_same / len(gold_toks)
    return (2 * precision * recall) / (precision + recall)


def _v2_references(references: Sequence[str], lang: str | None = None) -> list[str]:
    """The references v2.0 scores against: non-empty after normalisation, or else just ""."""
    return [r for r in references if normalize_answer(r, lang)] or [""]


def exact_match(prediction: str, references: Sequence[str], lang: str | None = None) -> float:
    """1.0 if `prediction` equals some reference after normalisation, else 0.0 (v2.0 rules).

    With no (non-empty) reference, i.e. an unanswerable question, only "" is right. Scores are in
    0..1; the aggregate `score_*` functions report percentages like the official scripts.
    """
    return max(_exact(prediction, r, lang) for r in _v2_references(references, lang))


def f1(prediction: str, references: Sequence[str], lang: str | None = None) -> float:
    """Best token-overlap F1 of `prediction` against the references, in 0..1 (v2.0 rules)."""
    return max(_f1(prediction, r, True, lang) for r in _v2_references(references, lang))


def _questions(articles: Articles) -> Iterator[dict[str, Any]]:
    for article in articles:
        for paragraph in article["paragraphs"]:
            yield from paragraph["qas"]


def _references(qa: dict[str, Any]) -> list[str]:
    return [a["text"] for a in qa["answers"]]


def question_ids(articles: Articles) -> list[str]:
    return [qa["id"] for qa in _questions(articles)]


def require_all(qids: Collection[str], mapping: Mapping[str, Any], what: str) -> None:
    """v2.0 needs a value for every question: the official script crashes (KeyError) without one."""
    missing = [qid for qid in qids if qid not in mapping]
    if missing:
        more = ", ..." if len(missing) > 3 else ""
        raise ValueError(f"no {what} for {len(missing)} of {len(qids)} questions: {', '.join(missing[:3])}{more}")


def score_v1(articles: Articles, predictions: Mapping[str, str], lang: str | None = None) -> dict[str, float]:
    """`{"exact_match", "f1"}` in percent, as `evaluate-v1.1.py` prints them."""
    exact, f1_sum, total = 0.0, 0.0, 0
    for qa in _questions(articles):
        total += 1
        if qa["id"] not in predictions:
            print(f"Unanswered question {qa['id']} will receive score 0.", file=sys.stderr)
            continue
        refs, pred = _references(qa), predictions[qa["id"]]
        if not refs:
            raise ValueError(f"question {qa['id']} has no answers (SQuAD v1.1 needs at least one)")
        exact += max(_exact(pred, r, lang) for r in refs)
        f1_sum += max(_f1(pred, r, False, lang) for r in refs)
    if not total:
        raise ValueError("no questions to score")
    return {"exact_match": 100.0 * exact / total, "f1": 100.0 * f1_sum / total}


def _percentages(exact: Mapping[str, float], f1s: Mapping[str, float], qids: list[str]) -> dict[str, float | int]:
    return {
        "exact": 100.0 * sum(exact[q] for q in qids) / len(qids),
        "f1": 100.0 * sum(f1s[q] for q in qids) / len(qids),
        "total": len(qids),
    }


def _best_threshold(
    predictions: Mapping[str, str], raw: Mapping[str, float], na_probs: Mapping[str, float], has_ans: Mapping[str, bool]
) -> tuple[float, float]:
    """The no-answer threshold that would maximise the score, searched as the official script does.

    Questions are taken in order of rising no-answer probability, ties in `na_probs` order (which
    can change the result, so it is kept); everything past the threshold counts as answered "".
    """
    best = current = float(sum(not v for v in has_ans.values()))
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in raw:
            continue
        current += raw[qid] if has_ans[qid] else (-1 if predictions[qid] else 0)
        if current > best:
            best, best_thresh = current, na_probs[qid]
    return 100.0 * best / len(raw), best_thresh


def score_v2(
    articles: Articles,
    predictions: Mapping[str, str],
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
    lang: str | None = None,
) -> dict[str, float]:
    """The dict `evaluate-v2.0.py` prints: exact, f1, total, HasAns_*, NoAns_* and, with `na_probs`
    (question id -> no-answer probability or score), best_exact(_thresh), best_f1(_thresh).

    A question whose `na_probs` value exceeds `na_prob_thresh` counts as answered "".
    """
    has_ans = {qa["id"]: bool(qa["answers"]) for qa in _questions(articles)}
    if not has_ans:
        raise ValueError("no questions to score")
    require_all(has_ans, predictions, "prediction")
    probs = {k: 0.0 for k in predictions} if na_probs is None else na_probs
    require_all(has_ans, probs, "no-answer probability")
    exact_raw, f1_raw, exact, f1s = {}, {}, {}, {}
    for qa in _questions(articles):
        qid, pred = qa["id"], predictions[qa["id"]]
        exact_raw[qid], f1_raw[qid] = exact_match(pred, _references(qa), lang), f1(pred, _references(qa), lang)
        answered_none = probs[qid] > na_prob_thresh
        exact[qid] = float(not has_ans[qid]) if answered_none else exact_raw[qid]
        f1s[qid] = float(not has_ans[qid]) if answered_none else f1_raw[qid]
    result = _percentages(exact, f1s, list(exact))
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [qid for qid, v in has_ans.items() if v == wanted]
        if qids:
            result.update({f"{prefix}_{k}": v for k, v in _percentages(exact, f1s, qids).items()})
    if na_probs is not None:
        for name, raw in (("exact", exact_raw), ("f1", f1_raw)):
            result[f"best_{name}"], result[f"best_{name}_thresh"] = _best_threshold(predictions, raw, probs, has_ans)
    return result


def score(
    articles: Articles,
    predictions: Mapping[str, str],
    na_probs: Mapping[str, float] | None = None,
    lang: str | None = None,
) -> dict[str, float]:
    """Score with the official script for the data's version (`squad.is_squad_v2`)."""
    if is_squad_v2({"data": articles}):
        return score_v2(articles, predictions, na_probs, lang=lang)
    if na_probs is not None:
        raise ValueError("no-answer probabilities apply to SQuAD v2.0 data only")
    return score_v1(articles, predictions, lang)
