#!/usr/bin/env python
"""Long windows: training features/s and peak memory at --max-seq-length 512, 2,048 and 8,192 (or --lengths),
for a model whose positions reach that far (ModernBERT, EuroBERT: 8,192).

Each length runs in a fresh process, so its peak memory is its own: the model loaded as bert-squad loads it
(`model.load_qa_model`, its span head where transformers has none), questions of the SQuAD file with their
context lengthened by the file's other paragraphs until every window is full (--max-seq-length tokens),
the features built as training builds them (timed: built features/s), then --steps training steps of
--batch features (forward, backward, AdamW; one step first, untimed) timed on the device. Peak memory is
torch's peak allocation on a GPU, the process's peak resident size on a CPU (the model, the features and
Python included; `memory_before_steps_gib` is the part before the steps, and the table's growth column the
steps' own). Prints a table and, as its last line, one JSON object.

    python bench/long_context.py --model DIR                      # 512, 2048, 8192
    python bench/long_context.py --model DIR --lengths 512 2048 --steps 2 --batch 1
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: torch and the project load in the worker processes
    import torch

    from bert_squad.data import Examples

SAMPLE = Path(__file__).resolve().parents[1] / "bert_squad" / "sample" / "train-v1.1.json"


def long_examples(train_file: str, tokenizer, length: int, count: int) -> Examples:
    """`count` questions of `train_file` whose contexts go on (after their own text, so answers keep their
    offsets) with the file's paragraphs, repeated until they alone are `length` tokens."""
    from bert_squad.data import Examples, read_squad

    records = read_squad(train_file).records
    filler = " ".join(dict.fromkeys(r["context"] for r in records))
    while len(tokenizer(filler, add_special_tokens=False, truncation=True, max_length=length)["input_ids"]) < length:
        filler = f"{filler} {filler}"
    chosen = [dict(r, context=f"{r['context']} {filler}") for r in (records * count)[:count]]
    return Examples([dict(r, id=f"{r['id']}-{i}") for i, r in enumerate(chosen)], str(train_file), False)


def features_of(args: argparse.Namespace, tokenizer, length: int) -> tuple:
    """(full windows of `length` tokens, enough for the steps; built features/s)."""
    from bert_squad.config import WindowConfig
    from bert_squad.features import build_features

    windows = WindowConfig(max_seq_length=length, doc_stride=min(128, length // 4), max_query_length=64)
    examples = long_examples(args.train_file, tokenizer, length, args.batch * (args.steps + 1))
    t0 = time.perf_counter()
    features = build_features(examples, tokenizer, windows, cache_dir=None, train=True)
    rate = len(features) / (time.perf_counter() - t0)
    full = [i for i, ids in enumerate(features["input_ids"]) if len(ids) == length]
    return features.select(full[: args.batch * (args.steps + 1)]), rate


def step(module: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict) -> None:
    loss = module(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def rss_gib() -> float:
    """This process's resident size now (Linux: /proc/self/statm, in pages)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def measure(args: argparse.Namespace, length: int) -> dict:
    """One length, in this (fresh) process: a row of the table."""
    import datasets
    import torch

    from bert_squad import model
    from bert_squad.batching import Collator

    datasets.disable_progress_bars()
    torch.manual_seed(0)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    tokenizer, module = model.load_tokenizer(args.model), model.load_qa_model(args.model)
    model.check_window(module, length, args.model)
    features, built = features_of(args, tokenizer, length)
    collate = Collator(tokenizer.pad_token_id)
    rows = features.select_columns(collate.columns(features))
    batches = [collate([rows[i] for i in range(k, k + args.batch)]) for k in range(0, len(rows), args.batch)]
    batches = [{k: v.to(device) for k, v in b.items()} for b in batches]
    module.to(device).train()
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-5)
    step(module, optimizer, batches[0])  # warm-up: kernels chosen, optimizer state made
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    before = torch.cuda.memory_allocated(device) / 2**30 if device.type == "cuda" else rss_gib()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    for batch in batches[1:]:
        step(module, optimizer, batch)
    sync()
    seconds = time.perf_counter() - t0
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**30
    else:  # the high-water mark (KiB), not below what was resident before the steps (pages counted alike)
        peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, before, rss_gib())
    trained = args.batch * args.steps
    return {
        "max_seq_length": length,
        "features": trained,
        "tokens_per_feature": length,
        "features_per_second": trained / seconds,
        "tokens_per_second": trained * length / seconds,
        "built_features_per_second": built,
        "peak_memory_gib": peak,
        "memory_before_steps_gib": before,
        "device": str(device),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a model dir whose positions reach the longest --lengths")
    p.add_argument("--train-file", default=str(SAMPLE), help="SQuAD JSON the questions and filler text come from")
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    p.add_argument("--steps", type=int, default=4, help="timed training steps per length")
    p.add_argument("--batch", type=int, default=1, help="features per step")
    p.add_argument("--device", help="torch device (default: cuda when there is one, else cpu)")
    args = p.parse_args()
    if min([*args.lengths, args.steps, args.batch]) < 1:
        p.error("--lengths, --steps and --batch must be positive")
    rows = []
    print(f"{'length':>7} {'features/s':>11} {'tokens/s':>10} {'built/s':>9} {'peak GiB':>9} {'growth GiB':>10}")
    for length in args.lengths:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as fresh:
            row = fresh.submit(measure, args, length).result()
        rows.append(row)
        print(
            f"{length:7d} {row['features_per_second']:11.2f} {row['tokens_per_second']:10.0f} "
            f"{row['built_features_per_second']:9.1f} {row['peak_memory_gib']:9.3f} "
            f"{row['peak_memory_gib'] - row['memory_before_steps_gib']:10.3f}",
            flush=True,
        )
    print(
        json.dumps(
            {"model": args.model, "device": rows[0]["device"], "batch": args.batch, "steps": args.steps, "rows": rows}
        )
    )


if __name__ == "__main__":
    from bert_squad.errors import UserError

    try:
        main()
    except UserError as err:  # a bad --model or --train-file, or a length past the model's positions
        raise SystemExit(f"long_context: {err}") from None
