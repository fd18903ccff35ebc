"""Examples -> model features: sliding windows over long contexts, with exact span labels.

Follows the fast tokenizer's offset mapping (as Hugging Face's run_qa does): a context longer than the
window becomes several features that overlap by `doc_stride` tokens. A train feature is labelled with
the token span whose characters are exactly the answer's, or with CLS (index 0) when the answer is not
inside that window or the question is unanswerable. Eval features keep offsets for context tokens
only, so post-processing can map spans back to the original characters.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from bert_squad import cache, files
from bert_squad.errors import UserError

if TYPE_CHECKING:  # types only: datasets and transformers load where features are built
    import datasets
    from transformers import BatchEncoding, PreTrainedTokenizerFast

    from bert_squad.config import WindowConfig
    from bert_squad.data import Examples
    from bert_squad.distributed import DistEnv

FEATURES_FORMAT = 2  # bump when the feature layout changes, so old caches are not reused
QUESTIONS_PER_WORKER = 500  # the fewest questions worth a process of their own


def _truncate_questions(
    tokenizer: PreTrainedTokenizerFast, questions: Sequence[str], max_query_length: int
) -> list[str]:
    """Cut questions to `max_query_length` tokens at the character boundary the offsets give."""
    questions = [q.lstrip() for q in questions]  # leading spaces only waste tokens; SQuAD has some
    enc = tokenizer(questions, add_special_tokens=False, return_offsets_mapping=True)
    return [
        q if len(offsets) <= max_query_length else q[: offsets[max_query_length - 1][1]]
        for q, offsets in zip(questions, enc["offset_mapping"])
    ]


def _trim_offsets(text: str, offsets: tuple[int, int]) -> tuple[int, int]:
    """A token's (start, end) without the whitespace SentencePiece (Metaspace) and byte-level BPE
    tokenizers fold into it, so labels and predicted spans start and end on the answer's characters."""
    start, end = offsets
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _tokenize(batch: dict[str, list[Any]], tokenizer: PreTrainedTokenizerFast, windows: WindowConfig) -> BatchEncoding:
    questions = _truncate_questions(tokenizer, batch["question"], windows.max_query_length)
    enc = tokenizer(
        questions,
        batch["context"],
        truncation="only_second",
        max_length=windows.max_seq_length,
        stride=windows.doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding=False,
    )
    for i, offsets in enumerate(enc["offset_mapping"]):
        context, seq_ids = batch["context"][enc["overflow_to_sample_mapping"][i]], enc.sequence_ids(i)
        enc["offset_mapping"][i] = [_trim_offsets(context, o) if s == 1 else o for o, s in zip(offsets, seq_ids)]
    return enc


def prepare_train(
    batch: dict[str, list[Any]], tokenizer: PreTrainedTokenizerFast, windows: WindowConfig
) -> BatchEncoding:
    """A batch of questions -> train features: each context cut into windows, each window labelled with
    the tokens of its question's answer, or with CLS (token 0) when it holds no whole answer.

    The answer is known by characters (`answer_start` and the length of its text); the model predicts
    tokens: the offsets give each context token's characters, and the label is the first token that ends
    after the answer starts and the last that starts before it ends. `answerable` keeps apart the two
    reasons for CLS, a window without the answer and a question without one (`feature_report` counts them).
    """
    # The question and its context tokenized as a pair, the context cut into windows of max_seq_length
    # tokens that overlap by doc_stride, each token's offsets trimmed to the characters it stands for.
    enc = _tokenize(batch, tokenizer, windows)
    # A long context gives several windows: each feature's question, as its row in this batch.
    sample_map = enc.pop("overflow_to_sample_mapping")
    starts, ends, answerable = [], [], []
    for i, offsets in enumerate(enc["offset_mapping"]):
        # Which sequence each token belongs to: 0 the question, 1 the context, None a special token.
        seq_ids = enc.sequence_ids(i)
        answers = batch["answers"][sample_map[i]]
        start_pos = end_pos = 0  # CLS, unless the answer is found whole in this window
        # This window's context tokens, one run of positions: the answer can only be between the first and last.
        ctx = [t for t, s in enumerate(seq_ids) if s == 1]
        if answers["text"] and ctx:  # no context tokens: all its characters are ones the tokenizer drops (controls)
            # The answer's characters in the context, [start_char, end_char): a train question has one answer
            # (the first is taken where a file lists several).
            start_char = answers["answer_start"][0]
            end_char = start_char + len(answers["text"][0])
            first, last = ctx[0], ctx[-1]
            # Only a window whose context spans all of the answer's characters is labelled with it; one that
            # holds a part or none of it points at CLS (the overlapping windows next to it may hold it whole).
            if offsets[first][0] <= start_char and offsets[last][1] >= end_char:
                # Forward from the window's first context token: the first to end after the answer's first
                # character holds it (or, where the answer begins with a space, is the token after it).
                start_pos = next(t for t in range(first, last + 1) if offsets[t][1] > start_char)
                # Back from its last: the last to start before the answer's end holds its last character.
                end_pos = next(t for t in range(last, first - 1, -1) if offsets[t][0] < end_char)
                if start_pos > end_pos:  # the answer covers no token (only whitespace): nothing to point at
                    start_pos = end_pos = 0
        starts.append(start_pos)
        ends.append(end_pos)
        answerable.append(bool(answers["text"]))
    # The offsets served the search; the model takes token ids and the two labels.
    enc.pop("offset_mapping")
    enc["start_positions"], enc["end_positions"] = starts, ends
    enc["example_index"] = [batch["index"][j] for j in sample_map]
    enc["answerable"] = answerable
    return enc


def prepare_eval(
    batch: dict[str, list[Any]], tokenizer: PreTrainedTokenizerFast, windows: WindowConfig
) -> BatchEncoding:
    enc = _tokenize(batch, tokenizer, windows)
    sample_map = enc.pop("overflow_to_sample_mapping")
    enc["example_id"] = [batch["id"][j] for j in sample_map]
    enc["offset_mapping"] = [
        [o if s == 1 else None for o, s in zip(offsets, enc.sequence_ids(i))]
        for i, offsets in enumerate(enc["offset_mapping"])
    ]
    return enc


def _cache_key(examples: Examples, tokenizer: PreTrainedTokenizerFast, windows: WindowConfig, train: bool) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([FEATURES_FORMAT, train, dataclasses.asdict(windows)]).encode())
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    spec.pop("truncation", None), spec.pop("padding", None)  # call-time state, not the vocabulary
    h.update(json.dumps(spec, sort_keys=True).encode())
    for r in examples.records:
        h.update(json.dumps(r, sort_keys=True).encode())
    return h.hexdigest()[:20]


def check_tokenizer(tokenizer: PreTrainedTokenizerFast, record: dict[str, Any], windows: WindowConfig) -> None:
    """Once, on the first question, before any feature is built: the tokenizer must turn the context into
    tokens with character offsets (a byte-level BPE or WordPiece vocabulary that matches nothing of the text
    gives none) and mark it as the second sequence of the pair (a post-processor template without it does
    not). Either way labels and answers could not be placed; said in one line naming the tokenizer. (Whether
    the windows fit the model's positions is the model's to say: `model.check_window`.)"""
    where = f"{tokenizer.name_or_path}: its tokenizer"
    # Cut to one window, as the features are: a whole long context would only make the tokenizer warn.
    cut = dict(truncation=True, max_length=windows.max_seq_length)
    alone = tokenizer(record["context"], add_special_tokens=False, return_offsets_mapping=True, **cut)
    if not any(end > start for start, end in alone["offset_mapping"]):
        raise UserError(
            f"{where} turns the context of question {record['id']} into no tokens with character "
            f"offsets (an empty vocabulary, or one made for other text?)"
        )
    pair = tokenizer(record["question"], record["context"], **cut)
    if 1 not in pair.sequence_ids():
        raise UserError(
            f"{where} does not mark the context of question {record['id']} as a second sequence "
            f"(its post-processor template has no pair with $B): question and context cannot be told "
            f"apart"
        )


def worker_count(requested: int | None, questions: int) -> int:
    """Processes that build features: `requested` (default: every core this process may run on), but none
    for fewer than QUESTIONS_PER_WORKER questions (starting it would cost more than its share of the work)."""
    workers = requested or len(os.sched_getaffinity(0))
    return max(1, min(workers, questions // QUESTIONS_PER_WORKER))


@contextlib.contextmanager
def _tokenizer_threads_off(forking: bool) -> Iterator[None]:
    """While worker processes fork: the tokenizers' own threads off unless the user chose (a tokenizer that ran
    threads before the fork would warn in every worker); the variable as it was afterwards, since library code
    changes nothing process-wide."""
    if not forking or "TOKENIZERS_PARALLELISM" in os.environ:
        yield
        return
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        os.environ.pop("TOKENIZERS_PARALLELISM", None)


def _write_cache(
    ds: datasets.Dataset, fn: Callable[..., BatchEncoding], kwargs: dict[str, Any], cache_file: Path, workers: int
) -> None:
    """The features of `ds`, built by `workers` processes (each a contiguous share of the questions, in
    order) and written as one Arrow file, whatever the number of workers: the cache is the same for any."""
    from datasets.arrow_writer import ArrowWriter  # heavy: only where features are built

    parts = files.scratch(cache_file.parent, cache_file.stem, directory=True)  # ranks and jobs share the cache
    try:
        with _tokenizer_threads_off(workers > 1):
            built = ds.map(
                fn,
                num_proc=workers if workers > 1 else None,
                cache_file_name=str(parts / "part.arrow"),
                remove_columns=ds.column_names,
                **kwargs,
            )
        with ArrowWriter(features=built.features, path=str(parts / "all.arrow")) as writer:
            writer.write_table(built.data.table)
            writer.finalize()
        os.replace(parts / "all.arrow", cache_file)
    finally:
        shutil.rmtree(parts, ignore_errors=True)


def _questions(examples: Examples, name: str) -> datasets.Dataset:
    """The examples as a table under its own fingerprint (see `build_features`), the input of feature
    building: made only where features are built, so a rank that finds them in the cache never holds the
    whole question set."""
    import datasets  # heavy: only where features are built
    from datasets.table import InMemoryTable

    questions = InMemoryTable.from_pylist([dict(r, index=i) for i, r in enumerate(examples.records)])
    return datasets.Dataset(questions, fingerprint=f"{name}-questions")


def build_features(
    examples: Examples,
    tokenizer: PreTrainedTokenizerFast,
    windows: WindowConfig,
    cache_dir: str | Path | None,
    train: bool,
    dist: DistEnv | None = None,
    workers: int | None = None,
) -> datasets.Dataset:
    """Tokenize once: rank 0 writes an on-disk cache keyed by data, tokenizer and lengths; others load it.

    Without `cache_dir` (a handful of questions) the features stay in memory; `dist` is needed with a cache
    shared by several ranks. `workers`: --preprocessing-workers (see `worker_count`).
    """
    import datasets  # heavy: not for the commands that tokenize nothing
    from datasets.table import MemoryMappedTable

    from bert_squad import distributed  # torch's: loaded with datasets, after a command's inputs are checked

    kind = "train" if train else "eval"
    # Without a cache nothing is on disk to find again: no key is worth computing (hashing the tokenizer costs
    # more than the work).
    name = f"{kind}-{'in-memory' if cache_dir is None else _cache_key(examples, tokenizer, windows, train)}"
    # Each Dataset is given its fingerprint: datasets would otherwise hash the new table by pickling it with dill,
    # which pickles by value any module imported from outside the interpreter's prefix. Where pyarrow comes from
    # such a folder (wheels on PYTHONPATH beside a container's own Python), that pickle reaches pyarrow's
    # MonthDayNano type and raises PicklingError before the first step. The cache key names the features exactly.
    fn = prepare_train if train else prepare_eval
    kwargs = dict(
        batched=True,
        batch_size=1000,
        fn_kwargs={"tokenizer": tokenizer, "windows": windows},
        new_fingerprint=name,
    )
    if cache_dir is None:
        ds = _questions(examples, name)
        with _no_progress_bars():  # the Answerer's questions, a call at a time: no bar for each
            return ds.map(fn, keep_in_memory=True, remove_columns=ds.column_names, **kwargs)
    cache_file = cache.features_dir(cache_dir) / f"{name}.arrow"
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    with distributed.rank_zero_first(dist):
        if not cache_file.is_file():  # other ranks find rank 0's, unless the cache is not shared with them
            _write_cache(_questions(examples, name), fn, kwargs, cache_file, worker_count(workers, len(examples)))
        return datasets.Dataset(MemoryMappedTable.from_file(str(cache_file)), fingerprint=name)


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    """datasets' progress bars off for a block, and as they were after it (a program's own choice stays)."""
    import datasets  # heavy: not for the commands that tokenize nothing

    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if shown:
            datasets.enable_progress_bars()


def feature_report(examples: Examples, train_features: datasets.Dataset) -> dict[str, int]:
    """Counts users need at start: how many answers no window contains (those train on CLS)."""
    answerable = sum(1 for r in examples.records if r["answers"]["text"])
    labelled = set()
    outside = 0
    for idx, start, ok in zip(
        train_features["example_index"], train_features["start_positions"], train_features["answerable"]
    ):
        if ok and start > 0:
            labelled.add(idx)
        elif ok:
            outside += 1
    return {
        "examples": len(examples),
        "features": len(train_features),
        "answerable": answerable,
        "windows_without_answer": outside,
        "answers_in_no_window": answerable - len(labelled),
        "skipped_bad_offsets": len(examples.skipped_ids),
        "skipped_empty_questions": len(examples.empty_question_ids),
        "repaired_surrogates": len(examples.repaired_ids),
    }
