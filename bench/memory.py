#!/usr/bin/env python
"""Peak memory of training and of evaluation at full-SQuAD scale, per rank and per node, on 1, 2 and 4 ranks.

The train file is copies of --train-file (question ids made unique) to about --train-questions questions
(88k: SQuAD v1.1 train), the eval file copies of --eval-file to about --eval-questions (10,570: its dev set).
Each phase runs as the project runs it (`python -m bert_squad` or `bert_squad evaluate`, under `mpirun` for
more than one rank) on a small model, so that only what grows with the data shows: by default a 2-layer BERT
with random weights on MiniLM's tokenizer (BERT's uncased WordPiece), at 384 tokens; training takes
--max-steps steps and no evaluation. Both phases' features are built into the cache first, as a run's rank 0
builds them once (`bench/preprocessing.py` measures that), so the runs measure reading them.

A rank's peak is its own peak resident set (getrusage's ru_maxrss at its exit, file pages it mapped
included). The node's is the largest sum over the ranks' processes of their proportional set size (Pss,
/proc/PID/smaps_rollup), sampled every --interval seconds: a page the ranks share (the mapped features,
the libraries) counts once. Prints a table and, as its last line, one JSON object.

    python bench/memory.py --train-file ../shared/data/squad/train-v1.1-head.json \\
        --eval-file ../shared/data/squad/dev-v1.1-subset.json
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from throughput import launcher, minilm_dir, random_bert_base

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout this script is in, whatever the venv has installed
AS_RANK = "--as-rank"  # argv[1] of a rank this script starts: its peaks folder follows, then bert-squad's argv
TINY_BERT = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128)


def repeated(source: str, questions: int, out: Path) -> int:
    """`out`: the articles of SQuAD file `source` repeated (question ids made unique) to the whole number of
    copies nearest `questions`; returns its number of questions."""
    squad = json.loads(Path(source).read_text())
    count = sum(len(p["qas"]) for a in squad["data"] for p in a["paragraphs"])
    copies = max(1, round(questions / count))

    def copy(article: dict, k: int) -> dict:
        paragraphs = [dict(p, qas=[dict(q, id=f"{q['id']}-{k}") for q in p["qas"]]) for p in article["paragraphs"]]
        return dict(article, paragraphs=paragraphs)

    out.write_text(json.dumps(dict(squad, data=[copy(a, k) for k in range(copies) for a in squad["data"]])))
    return copies * count


def phase_argv(phase: str, args: argparse.Namespace, data: Path, work: Path) -> list[str]:
    """bert-squad's arguments for one phase on the repeated file `data`."""
    common = ["--cache-dir", str(work / "cache"), "--max-seq-length", "384"]
    if phase == "eval":
        return [
            "evaluate",
            "--model-dir",
            str(args.model),
            *common,
            "--eval-file",
            str(data),
            "--output-dir",
            str(work / "eval-out"),
        ]
    return [
        "--model",
        str(args.model),
        *common,
        *("--train-file", str(data), "--output-dir", str(work / "train-out"), "--deepspeed-config", "ds_fp32"),
        *("--max-steps", str(args.max_steps), "--no-eval", "--no-export", "--overwrite-output-dir"),  # a run each
    ]


def build_cache(phase: str, argv: list[str]) -> None:
    """The phase's features into the cache, from the same examples, tokenizer and windows as its run."""
    import datasets

    from bert_squad import cache, config, data, evaluate, model, task
    from bert_squad.features import build_features

    datasets.disable_progress_bars()
    if phase == "eval":
        job = evaluate.parse(argv[1:])
        examples, windows, model_name, cache_dir = (
            data.read_squad(job.eval_files[0]),
            task.resolve(job.inference.model_dir(), job.inference.windows, {}).windows,  # as `evaluate` resolves them
            job.inference.model.model_dir,
            job.inference.model.cache_dir,
        )
    else:
        cfg = config.parse_run_config(argv)
        examples, windows, model_name, cache_dir = (
            data.load_examples(cfg.data)[0],
            cfg.windows,
            cfg.data.model,
            cfg.data.cache_dir,
        )
    tokenizer = model.load_tokenizer(cache.find_model(model_name, cache_dir))
    build_features(examples, tokenizer, windows, cache_dir, train=phase == "train")


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) if entry.name.isdigit() else None
        except (OSError, IndexError):  # gone since listed
            continue
        if ppid is not None:
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo.extend(children.get(found[-1], []))
    return found


def pss_kib(pids: list[int], executable: str) -> int:
    """The summed Pss of the processes among `pids` that run `executable` (the ranks, not mpirun's daemons)."""
    total = 0
    for pid in pids:
        try:
            if os.path.realpath(f"/proc/{pid}/exe") != executable:
                continue
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:  # ended since listed
            continue
        total += next(int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:"))
    return total


def launch(ranks: int, argv: list[str], peaks: Path, interval: float) -> int:
    """Run bert-squad's `argv` on `ranks` ranks to its end; the node's peak summed Pss (KiB) while it ran."""
    proc = subprocess.Popen(
        [*launcher(ranks), sys.executable, __file__, AS_RANK, str(peaks), *argv],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    node, executable, done = [0], os.path.realpath(sys.executable), threading.Event()

    def sample() -> None:
        while not done.wait(interval):
            node[0] = max(node[0], pss_kib(descendants(proc.pid), executable))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stderr = proc.communicate(timeout=3600)[1]
    done.set()
    sampler.join()
    if proc.returncode:
        sys.exit(f"memory: {' '.join(argv[:1])} on {ranks} rank(s) exited {proc.returncode}:\n{stderr[-3000:]}")
    return node[0]


def as_rank(peaks: Path, argv: list[str]) -> int:
    """One rank: bert-squad's `argv` in this process, then its peak resident set into `peaks`."""
    from bert_squad import cli, distributed

    rank = distributed.detect().rank
    code = cli.main(argv)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    (peaks / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "peak_rss_kib": peak}))
    return code


def measure(phase: str, ranks: int, argv: list[str], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One row: each rank's peak RSS and the node's peak Pss, in MiB."""
    peaks = work / f"peaks-{phase}-{ranks}"
    peaks.mkdir()
    node = launch(ranks, argv, peaks, args.interval)
    per_rank = [json.loads((peaks / f"rank{r}.json").read_text())["peak_rss_kib"] for r in range(ranks)]
    return {
        "phase": phase,
        "ranks": ranks,
        "rank_peak_rss_mib": [k / 1024 for k in per_rank],
        "node_pss_mib": node / 1024,
    }


def features_in(work: Path) -> set[str]:
    return {p.name for p in (work / "cache" / "features").glob("*.arrow")}


def row_line(row: dict[str, Any]) -> str:
    peaks = row["rank_peak_rss_mib"]
    others = f"{max(peaks[1:]):8.0f}" if len(peaks) > 1 else f"{'-':>8}"
    return (
        f"{row['phase']:5s} {row['questions']:>9,} {row['ranks']:5d} {peaks[0]:8.0f} {others} "
        f"{sum(peaks):8.0f} {row['node_pss_mib']:8.0f}"
    )


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train-file", required=True)
    p.add_argument("--eval-file", required=True)
    p.add_argument("--model", help="model dir (default: a 2-layer random BERT on MiniLM's tokenizer)")
    p.add_argument("--train-questions", type=int, default=88_000)
    p.add_argument("--eval-questions", type=int, default=10_570)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--phases", nargs="+", choices=["train", "eval"], default=["train", "eval"])
    p.add_argument("--max-steps", type=int, default=3)
    p.add_argument("--interval", type=float, default=0.2, help="seconds between samples of the node's Pss")
    args = p.parse_args()
    if min(args.ranks) < 1 or min(args.train_questions, args.eval_questions, args.max_steps) < 1:
        p.error("--ranks, --train-questions, --eval-questions and --max-steps must be positive")
    return args


def main() -> None:
    args = parse()
    rows, model_name = [], args.model or "a random BERT (2 layers, hidden 64) on MiniLM's tokenizer"
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as folder:
        work = Path(folder)
        if not args.model:
            from transformers.utils import logging

            logging.disable_progress_bar()
            args.model = random_bert_base(minilm_dir(), work / "model", **TINY_BERT)
        print("phase questions ranks   rank 0   others  sum/MiB  node/MiB", flush=True)
        for phase in args.phases:
            source, questions = (
                (args.train_file, args.train_questions) if phase == "train" else (args.eval_file, args.eval_questions)
            )
            count = repeated(source, questions, work / f"{phase}.json")
            argv = phase_argv(phase, args, work / f"{phase}.json", work)
            subprocess.run([sys.executable, __file__, "--build-cache", phase, *argv], cwd=ROOT, check=True)
            built = features_in(work)
            for ranks in args.ranks:
                rows.append(dict(measure(phase, ranks, argv, args, work), questions=count))
                print(row_line(rows[-1]), flush=True)
            if features_in(work) != built:
                sys.exit("memory: a run built its features anew: the measured runs must read the cached ones")
    print(json.dumps({"model": model_name, "rows": rows}))


if __name__ == "__main__":
    if sys.argv[1:2] == [AS_RANK]:
        sys.exit(as_rank(Path(sys.argv[2]), sys.argv[3:]))
    if sys.argv[1:2] == ["--build-cache"]:
        build_cache(sys.argv[2], sys.argv[3:])
    else:
        main()
