"""Independent SQuAD scorers, installed by name from PyPI, that the scorer tests compare with.

- SQuAD v1.1: torchmetrics' `squad` (`torchmetrics.functional.text.squad`, the test extra). It follows v1.1's
  published rules except in two known places, which the tests keep apart instead of papering over:
  its sums are float32 tensors (so totals agree to about 1e-6, not to the last bit), and an empty prediction
  scored against a reference that normalises to nothing gets F1 1 (v2.0's rule), where v1.1's F1 is 0
  (no token in common).
- SQuAD v2.0: transformers 4.x's `transformers.data.metrics.squad_metrics`, the v2.0 script's rules as
  Hugging Face ship them (removed in transformers 5). Only the compat environment (transformers 4.40.2) has it,
  so the tests that use it are marked `transformers4` and run there (`make test-compat`). Its
  `squad_evaluate` always adds the best-threshold keys; the v2.0 script adds them only with no-answer
  probabilities, so `transformers_v2` drops them when it is given none.
- MLQA's per-language rules have no registry implementation: tests/test_metrics.py checks them from the
  published rules by worked examples and properties.
"""

from __future__ import annotations

import pytest


def questions(articles: list):
    """Every question object of a file's articles, in file order."""
    for article in articles:
        for paragraph in article["paragraphs"]:
            yield from paragraph["qas"]


def _torchmetrics_squad():
    return pytest.importorskip(
        "torchmetrics.functional.text.squad",
        reason="torchmetrics is the SQuAD v1.1 oracle (setup.cfg's test extra installs it)",
    ).squad


def torchmetrics_v1(articles: list, predictions: dict) -> dict:
    """torchmetrics' SQuAD v1.1 score of a whole file: {"exact_match", "f1"} in percent, as Python floats."""
    squad = _torchmetrics_squad()
    targets = [
        {
            "id": q["id"],
            "answers": {
                "text": [a["text"] for a in q["answers"]],
                "answer_start": [a.get("answer_start", 0) for a in q["answers"]],
            },
        }
        for q in questions(articles)
    ]
    preds = [{"id": qid, "prediction_text": text} for qid, text in predictions.items()]
    import warnings

    with warnings.catch_warnings():  # "Unanswered question ... will receive score 0."
        warnings.simplefilter("ignore")
        return {k: float(v) for k, v in squad(preds, targets).items()}


def torchmetrics_v1_question(prediction: str, references: list) -> tuple:
    """torchmetrics' (exact match, F1) of one question, in 0..1."""
    one = torchmetrics_v1(
        [{"paragraphs": [{"qas": [{"id": "q", "answers": [{"text": r} for r in references]}]}]}], {"q": prediction}
    )
    return one["exact_match"] / 100, one["f1"] / 100


def squad_metrics_v2():
    """transformers 4.x's squad_metrics module, or skip (transformers 5 no longer ships it)."""
    return pytest.importorskip(
        "transformers.data.metrics.squad_metrics",
        reason="transformers 4.x's squad_metrics is the SQuAD v2.0 oracle; the compat "
        "environment has it (make test-compat runs the tests marked transformers4)",
    )


def _examples(articles: list) -> list:
    from transformers.data.processors.squad import SquadExample

    return [
        SquadExample(
            qas_id=q["id"],
            question_text=q.get("question", ""),
            context_text=p.get("context", ""),
            answer_text=None,
            start_position_character=None,
            title=a.get("title", ""),
            answers=q["answers"],
            is_impossible=not q["answers"],
        )
        for a in articles
        for p in a["paragraphs"]
        for q in p["qas"]
    ]


def transformers_v2(
    articles: list, predictions: dict, na_probs: dict | None = None, na_prob_thresh: float = 1.0
) -> dict:
    """What the SQuAD v2.0 script prints for these inputs, computed by transformers 4.x's `squad_evaluate`."""
    result = squad_metrics_v2().squad_evaluate(_examples(articles), predictions, na_probs, na_prob_thresh)
    if na_probs is None:
        result = {k: v for k, v in result.items() if not k.startswith("best_")}
    return dict(result)


def transformers_v2_per_question(articles: list, predictions: dict) -> dict:
    """Question id -> (exact, f1) before any no-answer threshold, from transformers 4.x's `get_raw_scores`."""
    exact, f1s = squad_metrics_v2().get_raw_scores(_examples(articles), predictions)
    return {qid: (exact[qid], f1s[qid]) for qid in exact}
