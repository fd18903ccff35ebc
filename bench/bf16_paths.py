#!/usr/bin/env python
"""What each of DeepSpeed's bf16 paths costs per training step here: host reads counted, time per step, and
losses beside fp32's, from the same weights, data and order. The shipped ds_bf16 follows from it
(docs/performance.md).

    python bench/bf16_paths.py                      # every path, 40 steps each
    python bench/bf16_paths.py --paths ds_bf16 stage0 --steps 3 --model DIR

Paths, each the shipped ds_fp32.json plus sections (`ds_bf16` is the shipped file itself):
- stage0: "bf16" alone. DeepSpeed 0.19.8 wraps torch's AdamW in its unfused 16-bit optimizer, whose overflow
  check (CheckOverflow.has_overflow_serial) reads a flag back to the host for each parameter tensor, each step.
- zero1: "bf16" with ZeRO stage 1: the ZeRO optimizer over one flat fp32 partition, one overflow flag a step.
- autocast: "torch_autocast" in bf16: fp32 weights and torch's AdamW, matmuls in bf16 under torch.autocast.
- fp32: the reference losses.

Each path trains with `python -m bert_squad` in a process of its own through this file's tap (`--tap`), which
counts, inside the engine's forward, backward and step, the calls of every has_overflow_serial DeepSpeed
defines and the host reads (Tensor.item, bool, float, int, tolist: on a GPU each waits for the device).
The model is BERT-base's 12 layers, hence its parameter tensors, at a small width (--hidden), with random
weights. Prints a table, then one JSON line.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import throughput

ROOT = throughput.ROOT
SHIPPED = ROOT / "bert_squad" / "configs"
SECTIONS = {
    "stage0": {"bf16": {"enabled": True}},
    "zero1": {"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}},
    "autocast": {"torch_autocast": {"enabled": True, "dtype": "bfloat16"}},
    "fp32": {},
}
PATHS = ("ds_bf16", *SECTIONS)
READS = ("item", "__bool__", "__float__", "__int__", "tolist")  # Tensor methods that copy a value to the host
ENGINE_CALLS = ("forward", "backward", "step")
COUNTS = ("has_overflow_serial", "host_reads", "overflow_check_reads", "optimizer_counter_reads")


def config_file(path: str, folder: Path) -> Path:
    """The DeepSpeed config of a path: the shipped ds_bf16, or ds_fp32 with the path's sections."""
    if path == "ds_bf16":
        return SHIPPED / "ds_bf16.json"
    out = folder / f"{path}.json"
    out.write_text(json.dumps({**json.loads((SHIPPED / "ds_fp32.json").read_text()), **SECTIONS[path]}))
    return out


def install_tap(counts: dict) -> None:
    """Count the calls of every has_overflow_serial, and the host reads made while the engine runs forward,
    backward or step: all of them, those inside an overflow check, and those of the step counters torch's Adam
    keeps on the host (0-dim tensors read inside the optimizer's step: no wait for a GPU). Wraps the real
    methods; nothing is replaced."""
    import torch
    from deepspeed.runtime import engine, utils
    from deepspeed.runtime.fp16 import loss_scaler
    from deepspeed.runtime.zero import stage3, stage_1_and_2

    inside = dict.fromkeys(("engine", "overflow", "optimizer"), 0)

    def scoped(owner, name, scope, on_call=None):
        real = getattr(owner, name)

        def tapped(*args, **kwargs):
            if on_call:
                counts[on_call] += 1
            inside[scope] += 1
            try:
                return real(*args, **kwargs)
            finally:
                inside[scope] -= 1

        setattr(owner, name, tapped)

    def read(name):
        real = getattr(torch.Tensor, name)

        def tapped(tensor, *args, **kwargs):
            if inside["engine"]:
                counts["host_reads"] += 1
                counts["overflow_check_reads"] += bool(inside["overflow"])
                counts["optimizer_counter_reads"] += bool(inside["optimizer"] and tensor.dim() == 0)
            return real(tensor, *args, **kwargs)

        setattr(torch.Tensor, name, tapped)

    for owner in (
        utils.CheckOverflow,
        loss_scaler.DynamicLossScaler,
        stage_1_and_2.DeepSpeedZeroOptimizer,
        stage3.DeepSpeedZeroOptimizer_Stage3,
    ):
        scoped(owner, "has_overflow_serial", "overflow", on_call="has_overflow_serial")
    for name in ENGINE_CALLS:
        scoped(engine.DeepSpeedEngine, name, "engine")
    scoped(torch.optim.AdamW, "step", "optimizer")
    for name in READS:
        read(name)
    timed(engine.DeepSpeedEngine, "step", counts["step_seconds"])


def timed(owner, name: str, seconds: list) -> None:
    """Each call's seconds appended to `seconds` (the engine's step: overflow check, clipping, the optimizer)."""
    real = getattr(owner, name)

    def tapped(*args, **kwargs):
        began = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - began)

    setattr(owner, name, tapped)


def tap(out: str, args: list) -> int:
    """`--tap OUT ARGS`: the training CLI with the tap installed; the counts go to OUT as JSON."""
    from bert_squad import cli

    counts = dict(dict.fromkeys(COUNTS, 0), step_seconds=[])
    install_tap(counts)
    try:
        return cli.main(args)
    finally:
        Path(out).write_text(json.dumps(counts))


def run_path(path: str, args: argparse.Namespace, work: Path) -> dict:
    """One path's training through the tap: counts per step, median step time, per-step losses, the engine."""
    out, counts = work / f"run-{path}", work / f"{path}.counts.json"
    run = argparse.Namespace(
        **{**vars(args), "deepspeed_config": str(config_file(path, work)), "cache_dir": work / "cache"}
    )
    python_m_bert_squad = 3
    cmd = [
        sys.executable,
        __file__,
        "--tap",
        str(counts),
        *throughput.command(run, out, fixed=False, log_every=1)[python_m_bert_squad:],
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"bf16_paths: the {path} run failed:\n{r.stderr[-3000:]}")
    metrics, tapped = json.loads((out / "train_metrics.json").read_text()), json.loads(counts.read_text())
    logs, batch = metrics["logs"], metrics["train_batch_size"]
    warm = len(logs) // 4  # the first quarter warms up
    timed = [batch / log["samples_per_second"] for log in logs[warm:]]
    return {
        "path": path,
        "engine": metrics["engine"],
        "precision": metrics["precision"],
        **{f"{key}_per_step": tapped[key] / args.steps for key in COUNTS},
        "ms_per_step": 1000 * statistics.median(timed),
        "engine_step_ms": 1000 * statistics.median(tapped["step_seconds"][warm:]),
        "losses": [log["loss"] for log in logs],
    }


def parameter_tensors(model: Path) -> int:
    from transformers import AutoConfig, AutoModelForQuestionAnswering

    return len(list(AutoModelForQuestionAnswering.from_config(AutoConfig.from_pretrained(model)).parameters()))


def show(rows: list, tensors: int) -> None:
    fp32 = next((r["losses"] for r in rows if r["path"] == "fp32"), None)
    print(
        f"\nper step, {tensors} parameter tensors; host reads: all / in overflow checks / of Adam's step "
        f"counters (kept on the host)"
    )
    print(
        f"{'path':9} {'optimizer (wrapper)':44} {'has_overflow_serial':>19} {'host reads':>16} {'ms/step':>8} "
        f"{'of it engine.step':>17} {'loss vs fp32':>12}"
    )
    for r in rows:
        e = r["engine"]
        built = e["optimizer"].rsplit(".", 1)[-1] + (f" ({e['optimizer_wrapper']})" if e["optimizer_wrapper"] else "")
        built += f" {e['autocast']} autocast" if e["autocast"] else ""
        worst = None if fp32 is None else max(abs(a - b) / abs(b) for a, b in zip(r["losses"], fp32))
        r["max_relative_loss_difference_vs_fp32"] = worst
        reads = "/".join(f"{r[k + '_per_step']:.0f}" for k in COUNTS[1:])
        print(
            f"{r['path']:9} {built:44} {r['has_overflow_serial_per_step']:19.0f} {reads:>16} "
            f"{r['ms_per_step']:8.1f} {r['engine_step_ms']:17.1f} {'' if worst is None else f'{worst:.2%}':>12}"
        )


def main() -> None:
    if sys.argv[1:2] == ["--tap"]:
        sys.exit(tap(sys.argv[2], sys.argv[3:]))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--hidden", type=int, default=64, help="the model's width (12 layers, heads of 32)")
    p.add_argument("--model", type=Path, help="a model directory instead of the random 12-layer one")
    p.add_argument("--train-file", type=Path, default=ROOT / "bert_squad" / "sample" / "train-v1.1.json")
    p.add_argument("--max-seq-length", type=int, default=128)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bf16-paths-") as tmp:
        work = Path(tmp)
        args.model = args.model or throughput.random_bert_base(
            throughput.minilm_dir(),
            work / "model",
            hidden_size=args.hidden,
            num_attention_heads=args.hidden // 32,
            intermediate_size=4 * args.hidden,
        )
        rows = [run_path(path, args, work) for path in args.paths]
        tensors = parameter_tensors(args.model)
    show(rows, tensors)
    print(json.dumps({"steps": args.steps, "parameter_tensors": tensors, "rows": rows}))


if __name__ == "__main__":
    main()
