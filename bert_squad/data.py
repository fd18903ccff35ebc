"""SQuAD examples: the official nested JSON (v1.1 / v2.0) or a hub dataset, as flat records.

The flat record is the Hugging Face `squad` schema (id, title, context, question, answers{text,
answer_start}) plus `is_impossible`, so local files and hub datasets take the same path. Text is
kept byte for byte: no whitespace normalisation, so every `answer_start` stays valid.
"""

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from bert_squad import cache
from bert_squad.errors import UserError
from bert_squad.files import read_json

HUB_DATASETS = {"squad": False, "squad_v2": True}  # name -> has unanswerable questions


@dataclass
class Examples:
    """Flat question records of one split, with what was skipped while reading them."""

    records: list
    source: str
    version_2: bool
    skipped_ids: list = field(default_factory=list)  # answer_start that does not match the text
    empty_question_ids: list = field(default_factory=list)  # question text empty or only whitespace

    def __len__(self):
        return len(self.records)

    def skip_summary(self):
        """What reading left out, as the start-up lines say it."""
        return (f"{len(self.skipped_ids)} questions skipped (answer_start off its text), "
                f"{len(self.empty_question_ids)} skipped (empty question)")


def _require(obj, key, kind, where, default=None):
    """obj[key] if it has the format's type (JSON true/false are no numbers); missing: `default`, or an
    error when the field is required (no default)."""
    if not isinstance(obj, dict) or (key not in obj and default is None):
        raise UserError(f"{where}: missing field '{key}'")
    value = obj.get(key, default)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise UserError(f"{where}: field '{key}' should be {kind.__name__}, not {type(value).__name__} ({value!r:.40})")
    return value


def is_squad_v2(doc):
    """SQuAD v2.0 data: its `version` says so, or a question carries `is_impossible` (1.1 never does).

    The one test of a file's version: training's scoring and `bert-squad score` both ask it."""
    if str(doc.get("version", "")).startswith("v2"):
        return True
    return any("is_impossible" in qa for article in doc.get("data", []) if isinstance(article, dict)
               for para in article.get("paragraphs", []) if isinstance(para, dict)
               for qa in para.get("qas", []) if isinstance(qa, dict))


def read_squad(path, strict=False):
    """Read an official SQuAD file; structural faults raise, answer-offset mismatches skip the question.

    A question whose `answer_start` does not point at its answer text (its labels would be wrong), or
    whose text is empty or whitespace (nothing to ask), is counted and skipped, or with `strict` raises.
    """
    path = Path(path)
    doc = read_json(path, what="a SQuAD JSON file")
    articles = _require(doc, "data", list, str(path))
    _require(doc, "version", str, str(path), default="")
    records, skipped, empty = [], [], []
    for a, article in enumerate(articles):
        title = _require(article, "title", str, f"{path}: article {a}", default="")
        where = f"{path}: article {a} ({title!r})" if title else f"{path}: article {a}"
        for p, para in enumerate(_require(article, "paragraphs", list, where)):
            context = _require(para, "context", str, f"{where} paragraph {p}")
            if not context.strip():
                raise UserError(f"{where} paragraph {p}: empty context")
            for q, qa in enumerate(_require(para, "qas", list, f"{where} paragraph {p}")):
                qid = _require(qa, "id", str, f"{where} paragraph {p} question {q}")
                qwhere = f"{path}: question {qid}"
                question = _require(qa, "question", str, qwhere)
                if not question.strip():
                    if strict:
                        raise UserError(f"{qwhere}: empty question (--strict; drop --strict to skip such questions)")
                    empty.append(qid)
                    continue
                impossible = _require(qa, "is_impossible", bool, qwhere, default=False)
                answers = _require(qa, "answers", list, qwhere)
                if not answers and not impossible:
                    raise UserError(f"{qwhere}: no answers, and not marked is_impossible")
                if answers and impossible:
                    raise UserError(f"{qwhere}: is_impossible is true, yet it has answers (SQuAD 2.0 keeps those of "
                                    f"an unanswerable question under 'plausible_answers')")
                texts, starts, bad = [], [], False
                for ans in answers:
                    text = _require(ans, "text", str, qwhere + " answer")
                    start = _require(ans, "answer_start", int, qwhere + " answer")
                    if context[start:start + len(text)] != text or not text.strip():
                        bad = True
                    texts.append(text)
                    starts.append(start)
                if bad:
                    if strict:
                        raise UserError(f"{qwhere}: answer_start does not point at the answer text "
                                        f"(--strict; drop --strict to skip such questions)")
                    skipped.append(qid)
                    continue
                records.append({"id": qid, "title": title, "context": context, "question": question,
                                "answers": {"text": texts, "answer_start": starts},
                                "is_impossible": impossible})
    if not records:
        raise UserError(f"{path}: no usable questions")
    ids = [r["id"] for r in records]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise UserError(f"{path}: question id {dup} appears more than once")
    return Examples(records, str(path), is_squad_v2(doc), skipped, empty)


def to_articles(records, version_2):
    """Nest flat records back into the official `data` list: what the official metrics read."""
    articles, paragraphs = {}, {}
    for r in records:
        article = articles.setdefault(r["title"], {"title": r["title"], "paragraphs": []})
        key = (r["title"], r["context"])
        if key not in paragraphs:
            paragraphs[key] = {"context": r["context"], "qas": []}
            article["paragraphs"].append(paragraphs[key])
        qa = {"id": r["id"], "question": r["question"],
              "answers": [{"text": t, "answer_start": s}
                          for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"])]}
        if version_2:  # the metrics pick the SQuAD version from the presence of this field
            qa["is_impossible"] = r["is_impossible"]
        paragraphs[key]["qas"].append(qa)
    return list(articles.values())


def load_hub_split(name, split, cache_dir):
    """A split of a hub dataset saved by --download-only; never touches the network."""
    path = cache.find_dataset(name, cache_dir)
    import datasets

    ds = datasets.load_from_disk(str(path))[split]
    records = [dict(r, is_impossible=not r["answers"]["text"]) for r in ds]
    empty = [r["id"] for r in records if not r["question"].strip()]
    return Examples([r for r in records if r["question"].strip()], f"{name}[{split}]", HUB_DATASETS[name],
                    empty_question_ids=empty)


def download_dataset(name, cache_dir):
    import datasets

    target = cache.dataset_dir(cache_dir, name)
    ds = datasets.load_dataset(name, cache_dir=str(Path(cache_dir) / "hf-datasets"))
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    ds.save_to_disk(str(tmp))
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target
