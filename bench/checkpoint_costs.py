#!/usr/bin/env python
"""What a checkpoint costs: writing it, the CRC-32 of its file list, and its universal conversion.

For each DeepSpeed config, one real run (`--ranks` ranks under mpirun, one optimizer step) writes one
checkpoint, whose marker records (the slowest rank's) seconds for
  write    DeepSpeed's save, the RNG file and hf/;
  crc      the file list: each rank's files read back, fsynced and CRC-32'd;
then, in this process,
  crc_only the CRC-32s alone (no fsync: the files are in the page cache, as right after the save);
  convert  the universal conversion a resume on another number of ranks makes (ZeRO stages 1-3;
           stage 0 needs none),
and the sizes of the checkpoint and of its conversion. The last line is JSON.

    python bench/checkpoint_costs.py --model "$(make -s minilm-dir)" [--configs ds_fp32,zero2_bf16] [--ranks 2]
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from throughput import launcher

ROOT = Path(__file__).resolve().parents[1]
# The shipped configs, and the CPU form of the shipped ZeRO ones (bf16 where they have fp16).
CONFIGS = {
    "ds_fp32": ("ds_fp32", {}),
    "ds_bf16": ("ds_bf16", {}),
    "zero2_bf16": ("ds_zero2", {"fp16": None, "bf16": {"enabled": True}}),
    "zero3_bf16": ("ds_zero3", {"fp16": None, "bf16": {"enabled": True}}),
}


def config_file(name, directory):
    shipped, changes = CONFIGS[name]
    cfg = json.loads((ROOT / "configs" / f"{shipped}.json").read_text())
    cfg.update(changes)
    path = Path(directory) / f"{name}.json"
    path.write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    return path


def write_checkpoint(args, name, directory):
    """One optimizer step and its checkpoint; the checkpoint's directory."""
    out = Path(directory) / name
    model = ["--model", args.model, "--deepspeed-config", str(config_file(name, directory))]
    data = ["--train-file", args.train_file, "--output-dir", str(out), "--cache-dir", str(Path(directory) / "cache")]
    windows = ["--max-seq-length", str(args.max_seq_length), "--doc-stride", "32", "--max-query-length", "24"]
    steps = ["--max-steps", "1", "--checkpoint-every", "1", "--no-eval"]
    cmd = [*launcher(args.ranks), sys.executable, "-m", "bert_squad", *model, *data, *windows, *steps]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=1800)
    if run.returncode:
        sys.exit(f"checkpoint_costs: the {name} run failed:\n{run.stderr[-3000:]}")
    return out / "checkpoints" / "step00000001"


def size(path):
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def measure(path, name):
    from bert_squad import checkpoint, resume

    seconds = json.loads((path / checkpoint.MARKER).read_text())["seconds"]
    row = {"config": name, "checkpoint_mb": size(path) / 2**20, "write_s": seconds["write"], "crc_s": seconds["digest"]}
    t0 = time.perf_counter()
    checkpoint.manifest(path)  # the CRC alone, the files still in the page cache as right after the save
    row["crc_only_s"] = time.perf_counter() - t0
    if checkpoint.layout(path).sharded:
        t0 = time.perf_counter()
        resume.convert_once(path)
        row["convert_s"] = time.perf_counter() - t0
        row["universal_mb"] = size(path / resume.DIR) / 2**20
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--train-file", default=str(ROOT / "bert_squad" / "sample" / "train-v1.1.json"))
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--max-seq-length", type=int, default=128)
    args = p.parse_args()
    from bert_squad import runtime

    runtime.prepare(deepspeed=True)  # as a bert-squad command sets its process up (DeepSpeed quiet on stdout)
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        for name in args.configs.split(","):
            row = measure(write_checkpoint(args, name, directory), name)
            rows.append(row)
            print("  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
    print(json.dumps({"model": args.model, "ranks": args.ranks, "rows": rows}))


if __name__ == "__main__":
    main()
