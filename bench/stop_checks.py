#!/usr/bin/env python
"""How often the ranks look for a stop request: the project's all-reduces against the steps trained.

Two ranks on this host (torchrun-style variables, gloo) train until rank 0 gets SIGUSR1 after step
`--signal-at-step`, through tests/reduce_tap.py, which records every call of the project's all-reduce with
its step. The ranks look at the first step, the log steps, and then about every STOP_CHECK_SECONDS of
training, so the number of looks follows the wall time, not the step count; this prints both. The last line
is JSON.

    python bench/stop_checks.py --model "$(make -s minilm-dir)" [--signal-at-step 40]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def train_until_signal(args: argparse.Namespace, directory: Path) -> tuple:
    """Both ranks' exit codes, rank 0's stdout, and the steps of rank 0's reductions."""
    from bert_squad.distributed import job_port

    calls = directory / "calls.json"
    tap = [sys.executable, str(ROOT / "tests" / "reduce_tap.py"), str(calls)]
    signal_at = ["--signal-at-step", str(args.signal_at_step)]  # the tap's own option, before the training's
    model = ["--model", args.model, "--train-file", args.train_file, "--deepspeed-config", "ds_fp32"]
    out = ["--output-dir", str(directory / "out"), "--cache-dir", str(directory / "cache")]
    windows = ["--max-seq-length", str(args.max_seq_length), "--doc-stride", "32", "--max-query-length", "24"]
    endless = ["--max-steps", "100000", "--log-every", "100000", "--no-eval"]  # until the signal stops it
    cmd = [*tap, *signal_at, *model, *out, *windows, *endless]
    common = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(job_port(os.getpid())))
    ranks = [
        subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=dict(common, RANK=str(r), LOCAL_RANK=str(r)),
        )
        for r in (0, 1)
    ]
    stdout = ranks[0].communicate(timeout=3600)[0]
    codes = [ranks[0].returncode, ranks[1].wait(timeout=600)]
    return codes, stdout, json.loads(Path(f"{calls}.rank0").read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--train-file", default=str(ROOT / "bert_squad" / "sample" / "train-v1.1.json"))
    p.add_argument("--signal-at-step", type=int, default=40)
    p.add_argument("--max-seq-length", type=int, default=128)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        start = time.perf_counter()
        codes, stdout, looks = train_until_signal(args, Path(directory))
        seconds = time.perf_counter() - start
    stopped = re.search(r"checkpoint at step (\d+) saved", stdout)
    if codes != [75, 75] or not stopped:
        sys.exit(f"stop_checks: the ranks exited {codes}, not 75 after a checkpoint:\n{stdout[-2000:]}")
    steps = int(stopped.group(1))
    row = {
        "steps": steps,
        "reductions": len(looks),
        "steps_per_reduction": steps / len(looks),
        "wall_s": seconds,
        "reduction_steps": looks,
    }
    print(
        f"{steps} steps, {len(looks)} reductions (one every {steps / len(looks):.1f} steps), {seconds:.0f} s "
        "in all, start-up included",
        flush=True,
    )
    print(json.dumps(row))


if __name__ == "__main__":
    main()
