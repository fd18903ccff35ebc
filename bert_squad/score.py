"""`bert-squad score`: score a predictions file the way the official SQuAD script would (with `--lang`, the
way MLQA's official script scores that language).

The last stdout line is `json.dumps` of exactly what `evaluate-v1.1.py` / `evaluate-v2.0.py` print,
so scripts can parse it and compare with published numbers; the table goes to stderr.
"""

import json
import numbers
from collections.abc import Sequence
from typing import Any, Callable, NamedTuple, Optional

from rich.console import Console
from rich.table import Table

from bert_squad import config, metrics
from bert_squad.config import PostprocessConfig
from bert_squad.errors import UserError
from bert_squad.files import PathLike, read_json, write_json_atomic
from bert_squad.squad import is_squad_v2


def _check_dataset(path: PathLike, doc: Any) -> None:
    """Fail on the first field the scorers would trip over, naming where it is."""
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise UserError(f"{path}: expected an object with a 'data' list (the official SQuAD format)")
    for a, article in enumerate(doc["data"]):
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise UserError(f"{path}: data[{a}] has no 'paragraphs' list")
        for p, para in enumerate(article["paragraphs"]):
            if not isinstance(para, dict) or not isinstance(para.get("qas"), list):
                raise UserError(f"{path}: data[{a}].paragraphs[{p}] has no 'qas' list")
            for q, qa in enumerate(para["qas"]):
                where = f"data[{a}].paragraphs[{p}].qas[{q}]"
                if not isinstance(qa, dict) or not isinstance(qa.get("id"), str):
                    raise UserError(f"{path}: {where} has no string 'id'")
                answers = qa.get("answers")
                if not isinstance(answers, list) or not all(
                    isinstance(x, dict) and isinstance(x.get("text"), str) for x in answers
                ):
                    raise UserError(
                        f"{path}: question {qa['id']} ({where}): 'answers' must be a list "
                        "of objects with a string 'text'"
                    )


def _check_mapping(path: PathLike, doc: Any, value_ok: Callable[[Any], bool], what: str) -> None:
    if not isinstance(doc, dict):
        raise UserError(f"{path}: expected an object mapping question id to {what}")
    for qid, value in doc.items():
        if not value_ok(value):
            raise UserError(f"{path}: question {qid}: expected {what}, got {json.dumps(value)[:60]}")


def _require_all(path: Optional[PathLike], qids: Sequence[str], mapping: Optional[dict[str, Any]], what: str) -> None:
    if mapping is None:
        return
    try:
        metrics.require_all(qids, mapping, what)
    except ValueError as err:
        raise UserError(f"{path}: {err}") from None


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _show(result: dict[str, Any], title: str) -> None:
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in result.items():
        table.add_row(key, f"{value:.2f}" if isinstance(value, float) else str(value))
    Console(stderr=True).print(table)


class Scoring(NamedTuple):
    """`bert-squad score`'s command line."""

    eval_file: str
    predictions: str
    na_probs: Optional[str]  # SQuAD v2.0's no-answer probabilities
    na_prob_thresh: Optional[float]
    lang: Optional[str]  # MLQA's normalization for this language instead of SQuAD's
    out_file: Optional[str]


def parse(argv: list[str]) -> Scoring:
    p = config.ArgumentParser(prog="bert-squad score", description=run.__doc__)
    p.add_argument("--eval-file", required=True, help="official-format SQuAD JSON (v1.1 or v2.0)")
    p.add_argument("--predictions", required=True, help="JSON object: question id -> answer text")
    p.add_argument("--na-probs", help="v2.0: JSON object question id -> no-answer probability/odds")
    p.add_argument(
        "--na-prob-thresh",
        type=float,
        default=None,
        help='v2.0: predict "" where the no-answer probability exceeds this (default 1.0)',
    )
    config.add_options(p, PostprocessConfig, only=("lang",))
    p.add_argument("--out-file", help="also write the metrics JSON here")
    args = p.parse_args(argv)
    lang = config.from_args(PostprocessConfig, args).lang  # its checks run here
    return Scoring(args.eval_file, args.predictions, args.na_probs, args.na_prob_thresh, lang, args.out_file)


def _inputs(asked: Scoring) -> tuple[Any, Any, Optional[Any]]:
    """(eval file's document, predictions, no-answer probabilities or None), each checked."""
    doc = read_json(asked.eval_file)
    _check_dataset(asked.eval_file, doc)
    predictions = read_json(asked.predictions)
    _check_mapping(asked.predictions, predictions, lambda v: isinstance(v, str), "an answer string")
    na_probs = None
    if asked.na_probs:
        na_probs = read_json(asked.na_probs)
        _check_mapping(asked.na_probs, na_probs, _is_number, "a number")
    return doc, predictions, na_probs


def run(asked: Scoring) -> int:
    """Score SQuAD predictions like evaluate-v1.1.py / evaluate-v2.0.py (version from the eval file)."""
    doc, predictions, na_probs = _inputs(asked)
    articles, v2 = doc["data"], is_squad_v2(doc)
    if not v2 and (na_probs is not None or asked.na_prob_thresh is not None):
        raise UserError(f"{asked.eval_file}: --na-probs and --na-prob-thresh apply to SQuAD v2.0 data only")
    qids = metrics.question_ids(articles)
    if not qids:
        raise UserError(f"{asked.eval_file}: no questions")
    try:
        if v2:
            _require_all(asked.predictions, qids, predictions, "prediction")
            _require_all(asked.na_probs, qids, na_probs, "no-answer probability")
            thresh = 1.0 if asked.na_prob_thresh is None else asked.na_prob_thresh
            result = metrics.score_v2(articles, predictions, na_probs, thresh, lang=asked.lang)
        else:
            result = metrics.score_v1(articles, predictions, asked.lang)
    except ValueError as err:  # what is left to go wrong is in the eval file
        raise UserError(f"{asked.eval_file}: {err}") from None
    if asked.out_file:  # first: an out-file that cannot be written is then the only line on stderr
        write_json_atomic(asked.out_file, result)
    scored_as = f", scored as MLQA's {asked.lang}" if asked.lang else ""
    _show(result, f"SQuAD {'v2.0' if v2 else 'v1.1'}, {len(qids)} questions{scored_as}")
    print(json.dumps(result))
    return 0
