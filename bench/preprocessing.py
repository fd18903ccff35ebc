#!/usr/bin/env python
"""Feature building (tokenization into sliding windows) in questions/s, with 1 and with 2 worker processes
(--preprocessing-workers), on a file of at least --questions questions made of copies of a SQuAD file.

Each count builds the features from scratch into its own empty cache, as a run's rank 0 does; the cache files
must come out identical. Prints a table and, as its last line, one JSON object.

    python bench/preprocessing.py --train-file ../shared/data/squad/train-v1.1-head.json
    python bench/preprocessing.py --train-file F --model DIR --workers 1 2 4 8
"""

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from throughput import minilm_dir


def copies(train_file, questions):
    """Enough copies of `train_file`'s questions (ids made unique) to reach `questions`."""
    from bert_squad.data import Examples, read_squad

    records = read_squad(train_file).records
    n = -(-questions // len(records))
    return Examples([dict(r, id=f"{r['id']}-{k}") for k in range(n) for r in records], f"{n} x {train_file}", False)


def build(examples, tokenizer, windows, workers, cache_dir):
    """(seconds, cache file bytes) of building the train features with `workers` processes."""
    from bert_squad.features import build_features

    t0 = time.perf_counter()
    build_features(examples, tokenizer, windows, cache_dir, train=True, workers=workers)
    seconds = time.perf_counter() - t0
    (cache_file,) = (Path(cache_dir) / "features").iterdir()
    return seconds, cache_file.read_bytes()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train-file", required=True)
    p.add_argument("--model", help="model dir whose tokenizer is used (default: MiniLM's, BERT's uncased WordPiece)")
    p.add_argument("--questions", type=int, default=50_000)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--max-seq-length", type=int, default=384)
    args = p.parse_args()
    import datasets

    from bert_squad.config import WindowConfig
    from bert_squad.model import load_tokenizer

    datasets.disable_progress_bars()
    tokenizer = load_tokenizer(args.model or minilm_dir())
    windows = WindowConfig(args.max_seq_length)
    examples = copies(args.train_file, args.questions)
    rates, caches = {}, set()
    for workers in args.workers:
        with tempfile.TemporaryDirectory() as cache_dir:
            seconds, cache = build(examples, tokenizer, windows, workers, cache_dir)
        rates[workers], _ = len(examples) / seconds, caches.add(cache)
        print(f"{workers:3d} workers: {len(examples)} questions in {seconds:6.1f} s = {rates[workers]:7.0f} questions/s",
              flush=True)
    if len(caches) != 1:
        raise SystemExit("preprocessing: the cached features differ between worker counts")
    first = args.workers[0]
    print(json.dumps({"questions": len(examples), "cores": len(os.sched_getaffinity(0)),
                      "questions_per_second": {str(w): r for w, r in rates.items()},
                      "speedup": {str(w): r / rates[first] for w, r in rates.items()}}))


if __name__ == "__main__":
    main()
