"""`bert-squad-test`: look at what a trained model answers, question by question.

Takes questions N..N+K-1 in file order, shows each paragraph with the predicted span highlighted next
to the reference answers and that question's EM/F1, then a summary table. Runs on CPU.
"""

import argparse
import json
import sys

from bert_squad import model as model_lib
from bert_squad.config import add_window_arguments
from bert_squad.data import Examples, load_hub_split, read_squad
from bert_squad.errors import UserError


def parse_args(argv):
    p = argparse.ArgumentParser(prog="bert-squad-test", description=__doc__.splitlines()[0])
    p.add_argument("--model-file", required=True, help="directory of a trained model (bert-squad --output-dir)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--eval-file", help="SQuAD JSON file (v1.1 or v2.0)")
    src.add_argument("--dataset", help="hub dataset in the cache (its validation split)")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--start-sample", type=int, default=0)
    p.add_argument("--num-test-samples", type=int, default=10)
    add_window_arguments(p)
    p.add_argument("--json", action="store_true", help="print a JSON list instead of the rich view")
    p.add_argument("--debug", action="store_true")
    args = p.parse_args(argv)
    if not args.eval_file and not args.dataset:
        args.dataset = "squad"
    return args


def require_qa_model(model_dir):
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"{model_dir / 'config.json'}: cannot read a model config ({err})") from None
    archs = config.get("architectures") or []
    if not any(a.endswith("ForQuestionAnswering") for a in archs):
        raise UserError(f"{model_dir}: not a question-answering model (architectures: {', '.join(archs) or 'none'}); "
                        f"give the --output-dir of a bert-squad training")


def predicted_offsets(prediction, nbest):
    """Where the predicted span is: its first n-best entry, which need not be the head (with a
    positive null threshold a span is predicted even when the null answer scores best)."""
    return next((e["offsets"] for e in nbest if prediction and e["text"] == prediction), None)


def answer(argv):
    """The selected questions with predictions and scores, as plain records."""
    import torch

    from bert_squad.evaluate import predict_logits
    from bert_squad.features import WindowConfig, build_features
    from bert_squad.metrics import exact_match, f1
    from bert_squad.postprocess import postprocess_predictions

    args = parse_args(argv)
    model_lib.go_offline()
    cache_dir = args.cache_dir or model_lib.default_cache_dir()
    model_dir = model_lib.resolve(args.model_file, cache_dir)
    require_qa_model(model_dir)
    examples = read_squad(args.eval_file) if args.eval_file else load_hub_split(args.dataset, "validation", cache_dir)
    first, count = args.start_sample, args.num_test_samples
    if count <= 0 or first < 0 or first + count > len(examples):
        raise UserError(f"{examples.source}: --start-sample {first} with --num-test-samples {count} is outside "
                        f"its {len(examples)} questions (questions 0..{len(examples) - 1})")
    chosen = Examples(examples.records[first:first + count], examples.source, examples.version_2)
    tokenizer = model_lib.load_tokenizer(model_dir)
    module = model_lib.load_qa_model(model_dir)
    win = WindowConfig(args.max_seq_length, args.doc_stride, args.max_query_length)
    features = build_features(chosen, tokenizer, win, cache_dir=None, train=False)
    logits = predict_logits(module, features, torch.device("cpu"), tokenizer.pad_token_id)
    meta = features.select_columns(["example_id", "offset_mapping"]).to_list()
    predictions, nbest, _ = postprocess_predictions(
        chosen.records, meta, *logits, version_2_with_negative=chosen.version_2,
        max_answer_length=args.max_answer_length, null_score_diff_threshold=args.null_score_diff_threshold)
    out = []
    for i, r in enumerate(chosen.records):
        pred = predictions[r["id"]]
        refs = r["answers"]["text"] or [""]
        out.append({"index": first + i, "id": r["id"], "question": r["question"], "context": r["context"],
                    "prediction": pred, "prediction_offsets": predicted_offsets(pred, nbest[r["id"]]),
                    "answers": r["answers"]["text"], "exact_match": 100.0 * exact_match(pred, refs),
                    "f1": 100.0 * f1(pred, refs)})
    return args, out


def render(results):
    from rich.console import Console
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    console = Console()
    for r in results:
        body = Text()
        body.append("Q: ", style="bold")
        body.append(r["question"] + "\n\n")
        para = Text(r["context"])
        if r["prediction_offsets"]:
            para.stylize("bold black on yellow", *r["prediction_offsets"])
        body.append_text(para)
        body.append("\n\nprediction: ", style="bold")
        body.append(r["prediction"] or "(no answer)", style="yellow")
        body.append("\nreferences: ", style="bold")
        body.append(" | ".join(r["answers"]) or "(unanswerable)", style="green")
        style = "green" if r["exact_match"] == 100 else "red" if r["f1"] == 0 else "yellow"
        console.print(Panel(body, title=f"#{r['index']} {r['id']}",
                            subtitle=f"EM {r['exact_match']:.0f}  F1 {r['f1']:.1f}", border_style=style))
    table = Table(title="bert-squad-test")
    for col in ("#", "id", "prediction", "references", "EM", "F1"):
        table.add_column(col, justify="right" if col in ("#", "EM", "F1") else "left", overflow="fold")
    for r in results:
        table.add_row(str(r["index"]), r["id"], r["prediction"] or "(no answer)", " | ".join(r["answers"]) or "-",
                      f"{r['exact_match']:.0f}", f"{r['f1']:.1f}")
    n = len(results)
    table.add_row("", "mean", "", "", f"{sum(r['exact_match'] for r in results) / n:.1f}",
                  f"{sum(r['f1'] for r in results) / n:.1f}", style="bold")
    console.print(table)


def _main(argv):
    args, results = answer(argv)
    if args.json:
        print(json.dumps([{k: v for k, v in r.items() if k != "context"} for r in results], ensure_ascii=False))
    else:
        render(results)
    return 0


def main(argv=None):
    from bert_squad.cli import run

    return run(_main, list(sys.argv[1:] if argv is None else argv), prog="bert-squad-test")
