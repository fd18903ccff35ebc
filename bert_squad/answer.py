"""Answering questions with a trained model: the `Answerer` API and `bert-squad answer`.

transformers 5 removed its question-answering pipeline; this is ours. It answers exactly as evaluation
scores: the same sliding windows (`features.build_features`) and the same post-processing
(`evaluate.predict`), so what a user sees here is what EM/F1 measured.

    from bert_squad.answer import Answerer
    qa = Answerer.from_pretrained("runs/bert-squad")
    qa.answer("Who wrote it?", "Ada wrote it in 1843.")  # -> [Answer(text, start, end, score)], best first
"""

import argparse
import dataclasses
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from bert_squad import cache, config, model, squad, task
from bert_squad.config import ModelConfig, PostprocessConfig, WindowConfig
from bert_squad.data import Examples
from bert_squad.errors import UserError, first_line
from bert_squad.evaluate import predict
from bert_squad.features import build_features, check_tokenizer
from bert_squad.files import PathLike, parse_json, read_json, read_text
from bert_squad.postprocess import Predictions, predicted_entry

if TYPE_CHECKING:  # torch and transformers load with the model, after the command's inputs are checked
    from transformers import PreTrainedModel, PreTrainedTokenizerFast


class Answer(NamedTuple):
    """One answer to a question: a span of the context, or no answer (SQuAD 2.0 models)."""

    text: str  # "" for no answer
    start: Optional[int]  # character offsets in the context: context[start:end] == text; None for no answer
    end: Optional[int]
    score: float  # probability among the question's n-best candidates


def find_qa_model(name_or_dir: str, cache_dir: Optional[str]) -> Path:
    """The directory of a question-answering model (`cache.find_model`). An encoder checkpoint would load with a
    random span head and answer nonsense: refused here."""
    model_dir = cache.find_model(name_or_dir, cache.resolve_cache_dir(cache_dir))
    config = read_json(model_dir / "config.json", what="a model config")
    if not isinstance(config, dict):
        raise UserError(f"{model_dir / 'config.json'}: a model config is a JSON object")
    archs = config.get("architectures") or []
    if not any(str(a).endswith("ForQuestionAnswering") for a in archs):
        raise UserError(
            f"{model_dir}: not a question-answering model (architectures: "
            f"{', '.join(map(str, archs)) or 'none'}); give the --output-dir of a bert-squad training"
        )
    return model_dir


class Answerer:
    """A question-answering model with its tokenizer, answering as evaluation does."""

    def __init__(
        self,
        module: "PreTrainedModel",
        tokenizer: "PreTrainedTokenizerFast",
        device: str = "cpu",
        windows: Optional[WindowConfig] = None,
        postprocess: Optional[PostprocessConfig] = None,
        null_answer: Optional[bool] = None,
    ) -> None:
        import torch  # heavy: loaded with the model, after the command's inputs are checked

        try:  # a device this torch was not built for, or that this machine lacks
            self.device = torch.device(device)
            torch.empty(0, device=self.device)
        except (RuntimeError, AssertionError) as err:
            raise UserError(f"device '{device}' is not usable here ({first_line(err)})") from None
        self.module = module.to(self.device).eval()
        self.tokenizer = tokenizer
        self.windows = windows or WindowConfig()
        self.postprocess = postprocess or PostprocessConfig()
        # SQuAD 2.0: "no answer" competes with the spans; None: the model records no version (`task.no_answer`)
        self.null_answer = null_answer

    @classmethod
    def from_pretrained(
        cls,
        name_or_dir: PathLike,
        device: str = "cpu",
        windows: Optional[WindowConfig] = None,
        postprocess: Optional[PostprocessConfig] = None,
        null_answer: Optional[bool] = None,
        cache_dir: Optional[str] = None,
    ) -> "Answerer":
        """`name_or_dir`: a model directory (a bert-squad --output-dir, or any Hugging Face QA model) or a hub
        name already in the cache: nothing is downloaded. `windows`, `postprocess` and `null_answer` default to
        what the model was trained with (its task settings, `bert_squad.task`), else to the options' defaults."""
        model_dir = find_qa_model(str(name_or_dir), cache_dir)
        given = [dataclasses.asdict(group) if group else {} for group in (windows, postprocess)]
        return cls.load(model_dir, task.resolve(model_dir, *given), device, null_answer)

    @classmethod
    def load(
        cls, model_dir: PathLike, settings: task.Settings, device: str = "cpu", null_answer: Optional[bool] = None
    ) -> "Answerer":
        """The model in `model_dir` answering with `settings` (`task.resolve`); `null_answer` defaults to the
        v2.0 mode it was trained in."""
        if null_answer is None:
            null_answer = settings.version_2_with_negative
        module, tokenizer = model.load_qa_model(model_dir), model.load_tokenizer(model_dir)
        return cls(module, tokenizer, device, settings.windows, settings.postprocess, null_answer)

    def predict(self, examples: Examples) -> Predictions:
        """`(predictions, nbest, null_odds)` for SQuAD `Examples`, as `evaluate.predict` gives them, "no answer"
        competing as every command's rule says (`task.no_answer`)."""
        model.check_window(self.module, self.windows.max_seq_length, self.tokenizer.name_or_path)
        check_tokenizer(self.tokenizer, examples.records[0], self.windows)
        features = build_features(examples, self.tokenizer, self.windows, cache_dir=None, train=False)
        asked = dataclasses.replace(examples, version_2=task.no_answer(self.null_answer, examples.version_2))
        result = predict(self.module, asked, features, self.device, self.tokenizer.pad_token_id, self.postprocess)
        assert result is not None  # one process, so it is rank 0
        return result

    def answer_batch(
        self, pairs: Iterable[tuple[str, str]], top_k: int = 1, ids: Optional[Sequence[Any]] = None
    ) -> list[list[Answer]]:
        """The `top_k` best answers to each (question, context) pair, best first; one batched pass."""
        pairs = list(pairs)
        ids = [str(i) for i in (ids or range(len(pairs)))]
        for qid, (question, context) in zip(ids, pairs):
            for field, text in (("question", question), ("context", context)):
                if not isinstance(text, str) or not text.strip():
                    raise UserError(f"question {qid}: the {field} is empty")
                if squad.lone_surrogate(text) is not None:
                    raise UserError(squad.surrogate_line(f"question {qid}: the {field}", text))
        records = [
            {
                "id": qid,
                "title": "",
                "question": q,
                "context": c,
                "answers": {"text": [], "answer_start": []},
                "is_impossible": False,
            }
            for qid, (q, c) in zip(ids, pairs)
        ]
        predictions, nbest, _ = self.predict(Examples(records, "input", version_2=False))  # no file: none to say
        return [_ranked(predictions[qid], nbest[qid], top_k) for qid in ids]

    def answer(self, question: str, context: str, top_k: int = 1) -> list[Answer]:
        return self.answer_batch([(question, context)], top_k)[0]


def _ranked(prediction: str, nbest: list[dict[str, Any]], top_k: int) -> list[Answer]:
    """The n-best list as Answers, the prediction first (see `postprocess.predicted_entry`)."""
    first = predicted_entry(prediction, nbest)
    ordered = ([first] if first else []) + [e for e in nbest if e is not first]
    return [Answer(e["text"], *_span(e), e["probability"]) for e in ordered[:top_k]]


def _span(entry: dict[str, Any]) -> tuple[Optional[int], Optional[int]]:
    """An n-best entry's character offsets, (None, None) for no answer."""
    start, end = entry["offsets"] or (None, None)
    return start, end


def read_questions(path: PathLike) -> tuple[list[str], list[tuple[str, str]]]:
    """JSON Lines of {"question", "context", "id"?}: (ids, pairs), one error line naming a bad line."""
    ids, pairs = [], []
    for n, line in enumerate(read_text(path, "a JSON Lines file").splitlines(), 1):
        if not line.strip():
            continue
        obj = parse_json(line, f"{path}:{n}")
        if not isinstance(obj, dict):
            raise UserError(f"{path}:{n}: a line is a JSON object with question and context")
        for key in ("question", "context"):
            if not isinstance(obj.get(key), str) or not obj[key].strip():
                raise UserError(f"{path}:{n}: field '{key}' should be a non-empty string")
            if squad.lone_surrogate(obj[key]) is not None:
                raise UserError(squad.surrogate_line(f"{path}:{n}: field '{key}'", obj[key]))
        ids.append(str(obj.get("id", n)))
        pairs.append((obj["question"], obj["context"]))
    if not pairs:
        raise UserError(f"{path}: no questions")
    repeated = next((i for n, i in enumerate(ids) if i in ids[:n]), None)
    if repeated is not None:
        raise UserError(f"{path}: id '{repeated}' repeats; give each line its own id")
    return ids, pairs


@dataclass(frozen=True)
class Asked:
    """What `bert-squad answer` is asked: the questions (one on the command line, or a file of them), the model
    and how it answers."""

    model: ModelConfig
    windows: dict[str, Any]  # the window options given; the rest are the model's (`task.resolve`)
    postprocess: dict[str, Any]  # the answer options given, likewise
    question: Optional[str]  # with `context` or `context_file`
    context: Optional[str]
    context_file: Optional[str]
    input: Optional[str]  # JSON Lines of questions instead of `question`
    top_k: int
    null_answer: Optional[bool]  # None: what the model was trained on
    device: Optional[str]  # None: cuda when there is one, else cpu
    as_json: bool


def add_answering_options(p: argparse.ArgumentParser) -> None:
    """How the model answers (its windows, the rules that make answers), which default to what it was trained
    with: what `answer` and `bert-squad-test` both take."""
    config.add_options(p, WindowConfig, unset=True)
    config.add_options(p, PostprocessConfig, unset=True)


def answering_options(args: argparse.Namespace) -> tuple[ModelConfig, dict[str, Any], dict[str, Any]]:
    """The model, and the window and answer options given, from a command line `add_answering_options` parsed."""
    return config.from_args(ModelConfig, args), config.given(WindowConfig, args), config.given(PostprocessConfig, args)


def load_answerer(
    asked: ModelConfig,
    windows: dict[str, Any],
    postprocess: dict[str, Any],
    device: Optional[str],
    null_answer: Optional[bool],
) -> tuple[Answerer, str]:
    """A command's Answerer on `device` (None: cuda where there is one, else cpu): the options given win over the
    model's task settings (`task.resolve`); and the line that says which came from where, for the command to print
    once it has answered (a model that cannot answer is one error line, this one not before it)."""
    model_dir = find_qa_model(asked.model_dir, asked.cache_dir)
    settings = task.resolve(model_dir, windows, postprocess)
    if device is None:
        import torch  # heavy: loaded with the model, once the model's directory and settings are checked

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return Answerer.load(model_dir, settings, device, null_answer), f"{model_dir}: {settings.line}"


def parse(argv: list[str]) -> Asked:
    p = config.ArgumentParser(prog="bert-squad answer", description="Answer questions with a trained model.")
    config.add_options(p, ModelConfig)
    p.add_argument("--question", help="one question (with --context or --context-file)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--context", help="the paragraph to answer from")
    src.add_argument("--context-file", help="a text file holding the paragraph")
    p.add_argument("--input", help='JSON Lines: one {"question", "context", "id"} object per line')
    p.add_argument("--top-k", type=int, default=1, help="answers per question, best first")
    p.add_argument(
        "--version-2-with-negative",
        "--version_2_with_negative",  # run_qa.py's spelling
        action="store_true",
        default=None,
        help="let 'no answer' compete (default: what the model was trained on)",
    )
    p.add_argument("--device", default=None, help="torch device (default: cuda when there is one, else cpu)")
    add_answering_options(p)
    p.add_argument("--json", action="store_true", help="JSON Lines out, one object per question")
    args = p.parse_args(argv)
    if (args.input is None) == (args.question is None):
        p.error("give --question (with --context or --context-file) or --input")
    if args.question is not None and args.context is None and args.context_file is None:
        p.error("--question needs --context or --context-file")
    if args.question is not None and not args.question.strip():
        p.error("--question is empty")
    if args.input is not None and (args.context is not None or args.context_file is not None):
        p.error("--input holds its contexts; --context/--context-file go with --question")
    if args.top_k <= 0:
        p.error(f"--top-k must be positive, not {args.top_k}")
    return Asked(
        *answering_options(args),
        args.question,
        args.context,
        args.context_file,
        args.input,
        args.top_k,
        args.version_2_with_negative,
        args.device,
        args.json,
    )


def _questions(asked: Asked) -> tuple[list[str], list[tuple[str, str]]]:
    if asked.input:
        return read_questions(asked.input)
    context = read_text(asked.context_file) if asked.context_file else asked.context
    assert context is not None and asked.question is not None  # parse: --question comes with one or the other
    if not context.strip():
        raise UserError(f"{asked.context_file or '--context'}: the context is empty")
    for where, text in (("--question", asked.question), ("--context", context)):
        if squad.lone_surrogate(text) is not None:  # a byte that is not UTF-8, as Python decodes the command line
            raise UserError(squad.surrogate_line(where, text) + " (a byte that is not UTF-8?)")
    return ["question"], [(asked.question, context)]


def highlighted(question: str, context: str, offsets: Optional[Sequence[int]]) -> Text:
    """The question, then its paragraph with the characters `offsets` (start, end) marked."""
    body = Text()
    body.append("Q: ", style="bold")
    body.append(question + "\n\n")
    para = Text(context)
    if offsets:
        para.stylize("bold black on yellow", *offsets)
    body.append_text(para)
    return body


def render(ids: list[str], pairs: list[tuple[str, str]], results: list[list[Answer]]) -> None:
    console = Console()
    for qid, (question, context), answers in zip(ids, pairs, results):
        best = answers[0] if answers else None
        span = [best.start, best.end] if best and best.start is not None and best.end is not None else None
        body = highlighted(question, context, span)
        for rank, a in enumerate(answers, 1):
            body.append(f"\n\n{rank}. " if rank == 1 else f"\n{rank}. ", style="bold")
            body.append(a.text or "(no answer)", style="yellow" if rank == 1 else "")
            body.append(f"  {a.score:.2f}")
        console.print(Panel(body, title=qid))


def run(asked: Asked) -> int:
    """`bert-squad answer`: one question, or JSON Lines of many; rich output or --json."""
    ids, pairs = _questions(asked)
    qa, settings = load_answerer(asked.model, asked.windows, asked.postprocess, asked.device, asked.null_answer)
    results = qa.answer_batch(pairs, asked.top_k, ids)
    print(settings, file=sys.stderr, flush=True)
    if not asked.as_json:
        render(ids, pairs, results)
        return 0
    for qid, (question, _), found in zip(ids, pairs, results):
        print(
            json.dumps({"id": qid, "question": question, "answers": [a._asdict() for a in found]}, ensure_ascii=False)
        )
    return 0
