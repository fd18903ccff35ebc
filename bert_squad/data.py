"""SQuAD examples: the official nested JSON (v1.1 / v2.0) or a hub dataset, as flat records.

The flat record is the Hugging Face `squad` schema (id, title, context, question, answers{text,
answer_start}) plus `is_impossible`, so local files and hub datasets take the same path. Text is
kept byte for byte: no whitespace normalisation, so every `answer_start` stays valid.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from bert_squad import cache, squad
from bert_squad.config import HUB_DATASETS, DataConfig
from bert_squad.errors import UserError
from bert_squad.files import read_json


@dataclass
class Examples:
    """Flat question records of one split, with what was skipped while reading them."""

    records: list[squad.Record]
    source: str
    version_2: bool
    skipped_ids: list[str] = field(default_factory=list)  # answer_start that does not match the text
    empty_question_ids: list[str] = field(default_factory=list)  # question text empty or only whitespace
    repaired_ids: list[str] = field(default_factory=list)  # kept, their lone UTF-16 surrogates replaced by U+FFFD

    def __len__(self) -> int:
        return len(self.records)

    def skip_summary(self) -> str:
        """What reading left out (and repaired, where it did), as the start-up lines say it."""
        repaired = (
            f", {len(self.repaired_ids)} repaired (lone UTF-16 surrogates replaced by U+FFFD)"
            if self.repaired_ids
            else ""
        )
        return (
            f"{len(self.skipped_ids)} questions skipped (answer_start off its text), "
            f"{len(self.empty_question_ids)} skipped (empty question){repaired}"
        )


def _require(obj: Any, key: str, kind: type, where: str, default: Any = None) -> Any:
    """obj[key] if it has the format's JSON type (true/false are no numbers); missing: `default`, or an error
    when the field is required (no default)."""
    if not isinstance(obj, dict) or (key not in obj and default is None):
        raise UserError(f"{where}: missing field '{key}'")
    value = obj.get(key, default)
    if not squad.has_type(value, kind):
        raise UserError(f"{where}: field '{key}' should be {squad.json_type_name(kind)}, not {value!r:.40}")
    return value


class _Skip(Exception):
    """A question left out (and counted) unless --strict: which list it goes to, and why."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind


def _question(qa: Any, context: str, path: Path, where: str, labelled: bool = True) -> dict[str, Any]:
    """One question as a flat record's fields, or _Skip; structural faults raise. Once it has an id, the
    question is named by it (`where` is its place in the file until then). Unless `labelled`, its answers
    (if any) are not read: the question is to be answered, not scored."""
    qid = _require(qa, "id", str, where)
    qwhere = f"{path}: question {qid}"
    question = _require(qa, "question", str, qwhere)
    if not question.strip():
        raise _Skip("empty", f"{qwhere}: empty question")
    impossible = _require(qa, "is_impossible", bool, qwhere, default=False)
    if not labelled:
        return {
            "id": qid,
            "question": question,
            "answers": {"text": [], "answer_start": []},
            "is_impossible": impossible,
        }
    answers = _require(qa, "answers", list, qwhere)
    if not answers and not impossible:
        raise UserError(f"{qwhere}: no answers, and not marked is_impossible")
    if answers and impossible:
        raise UserError(
            f"{qwhere}: is_impossible is true, yet it has answers (SQuAD 2.0 keeps those of an "
            f"unanswerable question under 'plausible_answers')"
        )
    texts = [_require(ans, "text", str, qwhere + " answer") for ans in answers]
    starts = [_require(ans, "answer_start", int, qwhere + " answer") for ans in answers]
    if any(context[s : s + len(t)] != t or not t.strip() for t, s in zip(texts, starts)):
        raise _Skip("offset", f"{qwhere}: answer_start does not point at the answer text")
    return {
        "id": qid,
        "question": question,
        "answers": {"text": texts, "answer_start": starts},
        "is_impossible": impossible,
    }


def _repaired(record: squad.Record, path: Path, strict: bool) -> tuple[squad.Record, bool]:
    """(`record` with each lone UTF-16 surrogate of its question, context, title and answers replaced by U+FFFD,
    whether it had one): such text is valid JSON but not Unicode, and no tokenizer takes it. One character
    for one, so every answer_start still points at its answer. An id is not repaired (predictions are filed
    under it), nor anything with `strict`: one error line instead."""
    if squad.lone_surrogate(record["id"]) is not None:
        raise UserError(
            squad.surrogate_line(
                f"{path}: question id {record['id']!r}", record["id"], "no predictions file can name it"
            )
        )
    texts = [
        ("question", record["question"]),
        ("context", record["context"]),
        ("title", record["title"]),
        *(("answer", t) for t in record["answers"]["text"]),
    ]
    damaged = next(((name, t) for name, t in texts if squad.lone_surrogate(t) is not None), None)
    if damaged is None:
        return record, False
    if strict:
        raise UserError(
            squad.surrogate_line(f"{path}: question {record['id']}: its {damaged[0]}", damaged[1])
            + " (--strict; drop --strict to replace such characters by U+FFFD)"
        )
    fix = squad.without_lone_surrogates
    answers = dict(record["answers"], text=[fix(t) for t in record["answers"]["text"]])
    return dict(
        record,
        question=fix(record["question"]),
        context=fix(record["context"]),
        title=fix(record["title"]),
        answers=answers,
    ), True


def _paragraphs(doc: Any, path: Path) -> Iterator[tuple[str, str, list[Any], str]]:
    """(title, context, qas, where) of every paragraph, checking the nesting on the way."""
    _require(doc, "version", str, str(path), default="")
    for a, article in enumerate(_require(doc, "data", list, str(path))):
        title = _require(article, "title", str, f"{path}: article {a}", default="")
        where = f"{path}: article {a} ({title!r})" if title else f"{path}: article {a}"
        for p, para in enumerate(_require(article, "paragraphs", list, where)):
            context = _require(para, "context", str, f"{where} paragraph {p}")
            if not context.strip():
                raise UserError(f"{where} paragraph {p}: empty context")
            yield title, context, _require(para, "qas", list, f"{where} paragraph {p}"), f"{where} paragraph {p}"


def read_squad(path: str | Path, strict: bool = False, labelled: bool = True) -> Examples:
    """Read an official SQuAD file; structural faults raise, answer-offset mismatches skip the question.

    A question whose `answer_start` does not point at its answer text (its labels would be wrong), or
    whose text is empty or whitespace (nothing to ask), is counted and skipped, or with `strict` raises;
    one whose text no tokenizer takes (a lone surrogate) is repaired and counted (`_repaired`).
    Unless `labelled` (`bert-squad predict`), answers are optional and left unread.
    """
    path = Path(path)
    doc = read_json(path, what="a SQuAD JSON file")
    records: list[squad.Record] = []
    skipped: dict[str, list[str]] = {"offset": [], "empty": [], "repaired": []}
    for title, context, qas, where in _paragraphs(doc, path):
        for q, qa in enumerate(qas):
            try:
                record = {
                    "title": title,
                    "context": context,
                    **_question(qa, context, path, f"{where} question {q}", labelled),
                }
                record, repaired = _repaired(record, path, strict)
                records.append(record)
                skipped["repaired"] += [record["id"]] if repaired else []
            except _Skip as skip:
                if strict:
                    raise UserError(f"{skip} (--strict; drop --strict to skip such questions)") from None
                skipped[skip.kind].append(qa["id"])
    if not records:
        raise UserError(f"{path}: no usable questions")
    ids = [r["id"] for r in records]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise UserError(f"{path}: question id {dup} appears more than once")
    return Examples(
        records, str(path), squad.is_squad_v2(doc), skipped["offset"], skipped["empty"], skipped["repaired"]
    )


def load_hub_split(name: str, split: str, cache_dir: str) -> Examples:
    """A split of a hub dataset saved by `bert-squad download`; never touches the network."""
    path = cache.find_dataset(name, cache_dir)
    import datasets  # heavy: only runs that read a hub dataset need it

    ds = datasets.load_from_disk(str(path))[split]
    records = [dict(r, is_impossible=not r["answers"]["text"]) for r in ds]
    empty = [r["id"] for r in records if not r["question"].strip()]
    return Examples(
        [r for r in records if r["question"].strip()], f"{name}[{split}]", HUB_DATASETS[name], empty_question_ids=empty
    )


class Splits(NamedTuple):
    """A run's examples."""

    train: Examples
    dev: Examples | None  # None with --no-eval, or with a --train-file and no --eval-file


def load_examples(data: DataConfig) -> Splits:
    """The train and dev examples, from local files or the cached hub dataset."""
    if data.train_file:
        train = read_squad(data.train_file, strict=data.strict)
        dev = read_squad(data.eval_file, strict=data.strict) if data.eval_file else None
    else:
        train = load_hub_split(data.dataset, "train", data.cache_dir)
        dev = (
            read_squad(data.eval_file, strict=data.strict)
            if data.eval_file
            else load_hub_split(data.dataset, "validation", data.cache_dir)
        )
    return Splits(train, None if data.no_eval else dev)
