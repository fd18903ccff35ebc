#!/usr/bin/env python
"""Feature building (tokenization into sliding windows) in questions/s, with 1 and with 2 worker processes
(--preprocessing-workers), on a file of at least --questions questions made of copies of a SQuAD file.

N workers run on N cores: each count runs in a fresh process allowed only those cores, so the tokenizer's
own thread pool is sized to them too (one process alone on the machine spreads its tokenizer threads over
every core, which is not one core's rate). That figure, one process with every core, is printed first, as
the reference a single process reaches. Each count builds the features from scratch into its own empty
cache, as a run's rank 0 does; the cache files must come out identical. Prints a table and, as its last
line, one JSON object.

    python bench/preprocessing.py --train-file ../shared/data/squad/train-v1.1-head.json
    python bench/preprocessing.py --train-file F --model DIR --workers 1 2 4 8
"""

import argparse
import hashlib
import json
import multiprocessing
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from throughput import minilm_dir


def copies(train_file, questions):
    """Enough copies of `train_file`'s questions (ids made unique) to reach `questions`."""
    from bert_squad.data import Examples, read_squad

    records = read_squad(train_file).records
    n = -(-questions // len(records))
    return Examples([dict(r, id=f"{r['id']}-{k}") for k in range(n) for r in records], f"{n} x {train_file}", False)


def build(args, workers, cpus, cache_dir):
    """Seconds to build the train features with `workers` processes, in a process confined to `cpus` before
    it loads the tokenizer."""
    os.sched_setaffinity(0, cpus)
    import datasets

    from bert_squad.config import WindowConfig
    from bert_squad.features import build_features
    from bert_squad.model import load_tokenizer

    datasets.disable_progress_bars()
    tokenizer = load_tokenizer(args.model or minilm_dir())
    examples = copies(args.train_file, args.questions)
    t0 = time.perf_counter()
    build_features(examples, tokenizer, WindowConfig(args.max_seq_length), cache_dir, train=True, workers=workers)
    return len(examples), time.perf_counter() - t0


def measure(args, workers, cpus):
    """(questions, seconds, sha256 of the cache file) of one count, in a fresh process."""
    with tempfile.TemporaryDirectory() as cache_dir:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as fresh:
            questions, seconds = fresh.submit(build, args, workers, cpus, cache_dir).result()
        (cache_file,) = (Path(cache_dir) / "features").iterdir()
        return questions, seconds, hashlib.sha256(cache_file.read_bytes()).hexdigest()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train-file", required=True)
    p.add_argument("--model", help="model dir whose tokenizer is used (default: MiniLM's, BERT's uncased WordPiece)")
    p.add_argument("--questions", type=int, default=50_000)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--max-seq-length", type=int, default=384)
    args = p.parse_args()
    if min(args.workers) < 1 or args.questions < 1:
        p.error("--workers and --questions must be positive")

    cores, caches = sorted(os.sched_getaffinity(0)), set()

    def rate(workers, cpus, where):
        questions, seconds, cache = measure(args, workers, cpus)
        caches.add(cache)
        print(
            f"{workers:3d} workers on {where:10s}: {questions} questions in {seconds:6.1f} s = "
            f"{questions / seconds:7.0f} questions/s",
            flush=True,
        )
        return questions, questions / seconds

    questions, one_process = rate(1, cores, "all cores")
    rates = {w: rate(w, cores[:w], f"{len(cores[:w])} core(s)")[1] for w in args.workers}
    if len(caches) != 1:
        raise SystemExit("preprocessing: the cached features differ between worker counts")
    first = args.workers[0]
    print(
        json.dumps(
            {
                "questions": questions,
                "cores": len(cores),
                "questions_per_second": {str(w): r for w, r in rates.items()},
                "one_process_all_cores": one_process,
                "speedup": {str(w): r / rates[first] for w, r in rates.items()},
            }
        )
    )


if __name__ == "__main__":
    from bert_squad.errors import UserError

    try:
        main()
    except UserError as err:  # a bad --train-file or --model, raised in the measuring process
        raise SystemExit(f"preprocessing: {err}") from None
