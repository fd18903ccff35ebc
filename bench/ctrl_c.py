#!/usr/bin/env python
"""How long a second Ctrl-C takes to end a training run that the first one is stopping.

A run trains (a log line every step, so the first Ctrl-C's stop comes at the next step and its checkpoint is
saved then); after `--first-at-step` it gets SIGINT, and once it says it is stopping, a second SIGINT. This prints
the seconds from the second signal to the process's end and how it ended (by SIGINT: -2); the last line is JSON.

    python bench/ctrl_c.py --model "$(make -s minilm-dir)" --train-file bert_squad/sample/train-v1.1.json
"""

import argparse
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--model", required=True, help="a model directory (or a hub name in the cache)")
    p.add_argument("--train-file", required=True, help="SQuAD JSON to train on")
    p.add_argument("--first-at-step", type=int, default=3, help="the step after which the first Ctrl-C comes")
    p.add_argument("--max-seq-length", type=int, default=128, help="tokens per window")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="ctrl-c-") as work:
        train = ["--model", args.model, "--train-file", args.train_file, "--max-seq-length", str(args.max_seq_length)]
        steps = ["--log-every", "1", "--max-steps", "100000", "--no-eval"]
        where = ["--output-dir", f"{work}/out", "--cache-dir", f"{work}/cache"]
        cmd = [sys.executable, "-m", "bert_squad", *train, *steps, *where]
        run = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert run.stdout is not None
        seconds = None
        for line in run.stdout:
            if re.match(rf"step {args.first_at_step}/", line):
                run.send_signal(signal.SIGINT)
            if "Ctrl-C again aborts" in line:
                t0 = time.perf_counter()
                run.send_signal(signal.SIGINT)
                run.wait()
                seconds = time.perf_counter() - t0
                break
        run.wait()
    if seconds is None:
        sys.exit(f"ctrl_c: the run ended ({run.returncode}) before it said it was stopping")
    print(f"second Ctrl-C to the end of the run: {seconds:.3f} s (exit {run.returncode})")
    print(json.dumps({"seconds": seconds, "returncode": run.returncode}))


if __name__ == "__main__":
    main()
