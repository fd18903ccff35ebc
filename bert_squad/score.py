"""`bert-squad score`: score a predictions file the way the official SQuAD script would (with `--lang`, the
way MLQA's official script scores that language).

The last stdout line is `json.dumps` of exactly what `evaluate-v1.1.py` / `evaluate-v2.0.py` print,
so scripts can parse it and compare with published numbers; the table goes to stderr.
"""

import json
import numbers

from rich.console import Console
from rich.table import Table

from bert_squad import config, metrics
from bert_squad.errors import UserError
from bert_squad.files import read_json, write_json_atomic
from bert_squad.squad import is_squad_v2


def _check_dataset(path, doc):
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
                        isinstance(x, dict) and isinstance(x.get("text"), str) for x in answers):
                    raise UserError(f"{path}: question {qa['id']} ({where}): 'answers' must be a list "
                                    "of objects with a string 'text'")


def _check_mapping(path, doc, value_ok, what):
    if not isinstance(doc, dict):
        raise UserError(f"{path}: expected an object mapping question id to {what}")
    for qid, value in doc.items():
        if not value_ok(value):
            raise UserError(f"{path}: question {qid}: expected {what}, got {json.dumps(value)[:60]}")


def _require_all(path, qids, mapping, what):
    if mapping is None:
        return
    try:
        metrics.require_all(qids, mapping, what)
    except ValueError as err:
        raise UserError(f"{path}: {err}") from None


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _show(result, title):
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in result.items():
        table.add_row(key, f"{value:.2f}" if isinstance(value, float) else str(value))
    Console(stderr=True).print(table)


def parse(argv):
    p = config.ArgumentParser(prog="bert-squad score", description=run.__doc__)
    p.add_argument("--eval-file", required=True, help="official-format SQuAD JSON (v1.1 or v2.0)")
    p.add_argument("--predictions", required=True, help="JSON object: question id -> answer text")
    p.add_argument("--na-probs", help="v2.0: JSON object question id -> no-answer probability/odds")
    p.add_argument("--na-prob-thresh", type=float, default=None,
                   help='v2.0: predict "" where the no-answer probability exceeds this (default 1.0)')
    p.add_argument("--lang", **config.LANG_OPTION)
    p.add_argument("--out-file", help="also write the metrics JSON here")
    p.add_argument("--debug", action="store_true", help="traceback on errors")
    return p.parse_args(argv)


def _inputs(args):
    """(eval file's document, predictions, no-answer probabilities or None), each checked."""
    doc = read_json(args.eval_file)
    _check_dataset(args.eval_file, doc)
    predictions = read_json(args.predictions)
    _check_mapping(args.predictions, predictions, lambda v: isinstance(v, str), "an answer string")
    na_probs = None
    if args.na_probs:
        na_probs = read_json(args.na_probs)
        _check_mapping(args.na_probs, na_probs, _is_number, "a number")
    return doc, predictions, na_probs


def run(args):
    """Score SQuAD predictions like evaluate-v1.1.py / evaluate-v2.0.py (version from the eval file)."""
    doc, predictions, na_probs = _inputs(args)
    articles, v2 = doc["data"], is_squad_v2(doc)
    if not v2 and (na_probs is not None or args.na_prob_thresh is not None):
        raise UserError(f"{args.eval_file}: --na-probs and --na-prob-thresh apply to SQuAD v2.0 data only")
    qids = metrics.question_ids(articles)
    if not qids:
        raise UserError(f"{args.eval_file}: no questions")
    try:
        if v2:
            _require_all(args.predictions, qids, predictions, "prediction")
            _require_all(args.na_probs, qids, na_probs, "no-answer probability")
            thresh = 1.0 if args.na_prob_thresh is None else args.na_prob_thresh
            result = metrics.score_v2(articles, predictions, na_probs, thresh, lang=args.lang)
        else:
            result = metrics.score_v1(articles, predictions, args.lang)
    except ValueError as err:  # what is left to go wrong is in the eval file
        raise UserError(f"{args.eval_file}: {err}") from None
    if args.out_file:  # first: an out-file that cannot be written is then the only line on stderr
        write_json_atomic(args.out_file, result)
    scored_as = f", scored as MLQA's {args.lang}" if args.lang else ""
    _show(result, f"SQuAD {'v2.0' if v2 else 'v1.1'}, {len(qids)} questions{scored_as}")
    print(json.dumps(result))
    return 0
