"""The official SQuAD JSON format (v1.1 and v2.0): its schema, its version, and flat records nested back.

    {"version": "v2.0", "data": [{"title": str, "paragraphs": [{"context": str, "qas": [
        {"id": str, "question": str, "answers": [{"text": str, "answer_start": int}],
         "is_impossible": bool, "plausible_answers": [...]}]}]}]}

`is_impossible` and `plausible_answers` are v2.0's; everything else is common to both versions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

# A UTF-16 surrogate in a Python string stands alone (json.loads joins an escaped pair into one character):
# valid JSON ("\ud800") or a byte that was not UTF-8 (as surrogateescape decodes a command line), but not
# Unicode, so no tokenizer takes it ("TextInputSequence must be str") and no UTF-8 file can hold it.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# A question as one flat record: the Hugging Face `squad` schema (id, title, context, question, answers{text,
# answer_start}) plus is_impossible.
Record = dict[str, Any]
REPLACEMENT = "\ufffd"  # what a lone surrogate is replaced by: one character for one, so offsets hold


def lone_surrogate(text: str) -> int | None:
    """The index of the first lone surrogate in `text`, or None."""
    found = _LONE_SURROGATE.search(text)
    return found.start() if found else None


def without_lone_surrogates(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD."""
    return _LONE_SURROGATE.sub(REPLACEMENT, text)


def surrogate_line(where: str, text: str, why: str = "no tokenizer takes it") -> str:
    """An error line for text holding a lone surrogate: where, at which character, and why that matters."""
    at = lone_surrogate(text)
    assert at is not None, "only text holding a lone surrogate has a line"
    return (
        f"{where} holds a lone UTF-16 surrogate ({text[at].encode('unicode_escape').decode()} at character "
        f"{at}), which is not Unicode text: {why}"
    )


def json_type_name(kind: type) -> str:
    return {str: "a string", list: "a list", bool: "true or false", int: "an integer", dict: "an object"}[kind]


def has_type(value: object, kind: type) -> bool:
    """JSON's types, not Python's: true is not the integer 1, and 1 is not true."""
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def is_squad_v2(doc: dict[str, Any]) -> bool:
    """SQuAD v2.0 data: its `version` says so, or a question carries `is_impossible` (1.1 never does).

    The one test of a file's version: reading, training's scoring and `bert-squad score` all ask it."""
    if str(doc.get("version", "")).startswith("v2"):
        return True
    return any(
        "is_impossible" in qa
        for article in doc.get("data", [])
        if isinstance(article, dict)
        for para in article.get("paragraphs", [])
        if isinstance(para, dict)
        for qa in para.get("qas", [])
        if isinstance(qa, dict)
    )


def to_articles(records: Iterable[dict[str, Any]], version_2: bool) -> list[dict[str, Any]]:
    """Nest flat records back into the official `data` list: what the official metrics read."""
    articles: dict[str, dict[str, Any]] = {}
    paragraphs: dict[tuple[str, str], dict[str, Any]] = {}
    for r in records:
        article = articles.setdefault(r["title"], {"title": r["title"], "paragraphs": []})
        key = (r["title"], r["context"])
        if key not in paragraphs:
            paragraphs[key] = {"context": r["context"], "qas": []}
            article["paragraphs"].append(paragraphs[key])
        qa = {
            "id": r["id"],
            "question": r["question"],
            "answers": [
                {"text": t, "answer_start": s} for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"])
            ],
        }
        if version_2:  # the metrics pick the SQuAD version from the presence of this field
            qa["is_impossible"] = r["is_impossible"]
        paragraphs[key]["qas"].append(qa)
    return list(articles.values())
