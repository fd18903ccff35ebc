"""`bert-squad-test`: look at what a trained model answers, question by question.

Takes questions N..N+K-1 in file order, shows each paragraph with the predicted span highlighted next
to the reference answers and that question's EM/F1, then a summary table. Runs on CPU.
"""

import json
import sys
from dataclasses import dataclass
from typing import Any, Optional

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from bert_squad import cache, config
from bert_squad.answer import add_answering_options, answering_options, highlighted, load_answerer
from bert_squad.config import ModelConfig
from bert_squad.data import Examples, load_hub_split, read_squad
from bert_squad.errors import UserError
from bert_squad.metrics import exact_match, f1
from bert_squad.postprocess import predicted_entry


@dataclass(frozen=True)
class Inspection:
    """What `bert-squad-test` is asked: the model, the questions to look at and how it answers them."""

    model: ModelConfig
    windows: dict[str, Any]  # the window options given; the rest are the model's (`task.resolve`)
    postprocess: dict[str, Any]  # the answer options given, likewise
    eval_file: Optional[str]  # a SQuAD JSON file, or None for the hub dataset
    dataset: str  # the hub dataset in the cache, where there is no eval file
    start_sample: int
    num_test_samples: int
    as_json: bool


def parse(argv: list[str]) -> Inspection:
    p = config.ArgumentParser(prog="bert-squad-test", description=(__doc__ or "").splitlines()[0])
    config.add_options(p, ModelConfig)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--eval-file", help="SQuAD JSON file (v1.1 or v2.0)")
    src.add_argument("--dataset", default="squad", help="hub dataset in the cache (its validation split)")
    p.add_argument("--start-sample", type=int, default=0, help="the first question shown, by its place in file order")
    p.add_argument("--num-test-samples", type=int, default=10, help="how many questions, from --start-sample on")
    add_answering_options(p)
    p.add_argument("--json", action="store_true", help="print a JSON list instead of the rich view")
    args = p.parse_args(argv)
    return Inspection(
        *answering_options(args),
        args.eval_file,
        args.dataset,
        args.start_sample,
        args.num_test_samples,
        args.json,
    )


def predicted_offsets(prediction: str, nbest: list[dict[str, Any]]) -> Optional[list[int]]:
    """Where the predicted span is (None for "no answer"), to highlight it where it stands."""
    entry = predicted_entry(prediction, nbest) if prediction else None
    return entry["offsets"] if entry else None


def collect(asked: Inspection) -> list[dict[str, Any]]:
    """The selected questions with predictions and scores, as plain records."""
    cache_dir = cache.resolve_cache_dir(asked.model.cache_dir)
    examples = (
        read_squad(asked.eval_file) if asked.eval_file else load_hub_split(asked.dataset, "validation", cache_dir)
    )
    first, count, total = asked.start_sample, asked.num_test_samples, len(examples)
    if count <= 0:
        raise UserError(f"--num-test-samples {count}: must be 1 or more")
    if not 0 <= first < total:
        raise UserError(
            f"{examples.source}: --start-sample {first} is outside its {total} questions (questions 0..{total - 1})"
        )
    qa, settings = load_answerer(asked.model, asked.windows, asked.postprocess, "cpu", None)
    # Up to the file's end, as a slice is: 5 questions from 230 of 232 are 230 and 231.
    chosen = Examples(examples.records[first : first + count], examples.source, examples.version_2)
    predictions, nbest, _ = qa.predict(chosen)
    print(settings, file=sys.stderr, flush=True)
    if first + count > total:
        print(f"{examples.source}: questions {first}..{total - 1}, its last", file=sys.stderr, flush=True)
    out = []
    for i, r in enumerate(chosen.records):
        pred = predictions[r["id"]]
        refs = r["answers"]["text"] or [""]
        out.append(
            {
                "index": first + i,
                "id": r["id"],
                "question": r["question"],
                "context": r["context"],
                "prediction": pred,
                "prediction_offsets": predicted_offsets(pred, nbest[r["id"]]),
                "answers": r["answers"]["text"],
                "exact_match": 100.0 * exact_match(pred, refs),
                "f1": 100.0 * f1(pred, refs),
            }
        )
    return out


def render(results: list[dict[str, Any]]) -> None:
    console = Console()
    for r in results:
        body = highlighted(r["question"], r["context"], r["prediction_offsets"])
        body.append("\n\nprediction: ", style="bold")
        body.append(r["prediction"] or "(no answer)", style="yellow")
        body.append("\nreferences: ", style="bold")
        body.append(" | ".join(r["answers"]) or "(unanswerable)", style="green")
        style = "green" if r["exact_match"] == 100 else "red" if r["f1"] == 0 else "yellow"
        console.print(
            Panel(
                body,
                title=f"#{r['index']} {r['id']}",
                subtitle=f"EM {r['exact_match']:.0f}  F1 {r['f1']:.1f}",
                border_style=style,
            )
        )
    table = Table(title="bert-squad-test")
    for col in ("#", "id", "prediction", "references", "EM", "F1"):
        table.add_column(col, justify="right" if col in ("#", "EM", "F1") else "left", overflow="fold")
    for r in results:
        table.add_row(
            str(r["index"]),
            r["id"],
            r["prediction"] or "(no answer)",
            " | ".join(r["answers"]) or "-",
            f"{r['exact_match']:.0f}",
            f"{r['f1']:.1f}",
        )
    n = len(results)
    table.add_row(
        "",
        "mean",
        "",
        "",
        f"{sum(r['exact_match'] for r in results) / n:.1f}",
        f"{sum(r['f1'] for r in results) / n:.1f}",
        style="bold",
    )
    console.print(table)


def run(asked: Inspection) -> int:
    results = collect(asked)
    if asked.as_json:
        print(json.dumps([{k: v for k, v in r.items() if k != "context"} for r in results], ensure_ascii=False))
    else:
        render(results)
    return 0
