"""Latency of answering one question on this machine: `bert-squad answer` as a user runs it (a fresh
process: imports, model load, one answer) and `Answerer.answer` once loaded (median of repeats).

    .venv/bin/python bench/answer_latency.py --model-dir runs/demo [--device cpu] [--repeats 20]
"""

import argparse
import statistics
import subprocess
import sys
import time

QUESTION = "Where was Ada Novak born?"
CONTEXT = (
    "Ada Novak was born in Lugano in 1834. She studied physics at the university of Zurich and later "
    "taught there for many years, writing two books on the theory of heat."
)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()

    cmd = [
        sys.executable,
        "-m",
        "bert_squad",
        "answer",
        "--model-dir",
        args.model_dir,
        "--device",
        args.device,
        "--question",
        QUESTION,
        "--context",
        CONTEXT,
        "--json",
    ]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    cold = time.perf_counter() - t0

    import torch

    from bert_squad.answer import Answerer

    t0 = time.perf_counter()
    qa = Answerer.from_pretrained(args.model_dir, device=args.device)
    load = time.perf_counter() - t0
    qa.answer(QUESTION, CONTEXT)  # warm-up
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        qa.answer(QUESTION, CONTEXT)
        times.append(time.perf_counter() - t0)
    print(f"answer: {done.stdout.strip()}")
    print(f"bert-squad answer, one question, fresh process: {cold:.2f} s wall")
    print(
        f"Answerer.from_pretrained: {load:.2f} s; answer(): median {1000 * statistics.median(times):.1f} ms, "
        f"min {1000 * min(times):.1f} ms over {args.repeats} ({args.device}, {torch.get_num_threads()} threads)"
    )


if __name__ == "__main__":
    main()
