"""`bert-squad` training with the checkpoint's save and load tapped, for tests of resuming elsewhere.

    python tests/state_tap.py DUMP_DIR <bert-squad training arguments>

Right before each `checkpoint.save` and right after each `resume.load`, rank 0 writes what the
engine holds: every parameter's fp32 master weight and Adam moments (whole, gathered from the ranks),
the learning rate, DeepSpeed's step count, the param groups' weight decay and the run's progress,
to DUMP_DIR/{saved,loaded}-step<N>.pt. The real training runs; nothing is replaced.
"""

import dataclasses
import sys
from pathlib import Path

import torch

from bert_squad import checkpoint, cli, resume


def full_state(engine):
    """{parameter name: [fp32 weight, exp_avg, exp_avg_sq]}, whole, for each optimizer DeepSpeed builds here:
    ZeRO 1-3 (a collective under ZeRO-3), the fp16/bf16 optimizer of stage 0, and torch's own AdamW."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    opt, named = engine.optimizer, list(engine.module.named_parameters())
    if engine.zero_optimization():
        if hasattr(opt, "_hp_optimizer_states_linked"):
            # ZeRO 1-2 link each parameter to its optimizer state after the first param group's first step,
            # before the second group has any (stage_1_and_2.py, _optimizer_step): link again now.
            opt._hp_optimizer_states_linked = False
            opt._lazy_init_hp_params_optimizer_state()
        moments = ("exp_avg", "exp_avg_sq")
        return {
            n: [safe_get_full_fp32_param(p)] + [safe_get_full_optimizer_state(p, k) for k in moments] for n, p in named
        }
    if hasattr(opt, "fp32_groups"):  # FP16_UnfusedOptimizer (16 bits, stage 0): an fp32 copy of each parameter
        name_of = {p: n for n, p in named}
        moments = opt.optimizer.state
        return {
            name_of[lp]: [hp.data, moments[hp]["exp_avg"], moments[hp]["exp_avg_sq"]]
            for lps, hps in zip(opt.fp16_groups, opt.fp32_groups)
            for lp, hp in zip(lps, hps)
        }
    return {n: [p.data, opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"]] for n, p in named}


def dump(engine, dist, progress, kind):
    tensors = {n: [t.detach().float().cpu().clone() for t in ts] for n, ts in full_state(engine).items()}
    if dist.is_main:
        torch.save(
            {
                "tensors": tensors,
                "lr": engine.get_lr(),
                "global_steps": engine.global_steps,
                "weight_decay": [g["weight_decay"] for g in engine.optimizer.param_groups],
                "accumulation": engine.gradient_accumulation_steps(),
                "world_size": dist.world_size,
                "progress": dataclasses.asdict(progress),
            },
            DUMPS / f"{kind}-step{progress.step}.pt",
        )


_save, _load = checkpoint.save, resume.load


def save(engine, output_dir, progress, keep, dist, *args, **kwargs):
    dump(engine, dist, progress, "saved")
    return _save(engine, output_dir, progress, keep, dist, *args, **kwargs)


def load(engine, decision, dist):
    progress = _load(engine, decision, dist)
    dump(engine, dist, progress, "loaded")
    return progress


if __name__ == "__main__":
    DUMPS = Path(sys.argv[1])
    DUMPS.mkdir(parents=True, exist_ok=True)
    checkpoint.save, resume.load = save, load
    sys.exit(cli.main(sys.argv[2:]))
