"""DeepSpeed checkpoints that survive crashes, time limits and preemption.

A checkpoint is `<output-dir>/checkpoints/step<N>/`, written by DeepSpeed on every rank plus one RNG
file per rank and, last, a `complete` marker from rank 0 that also records the world size and batch.
`latest` is replaced atomically only after the marker exists, so a crash mid-save leaves the previous
checkpoint as the one to resume from.

Resuming on another world size (a node lost, fewer ranks): when DeepSpeed kept the whole optimizer
state in one file (ZeRO stage 0 without bf16: ds_fp32), training goes on with all of it, the global
batch kept by changing gradient accumulation; from there on its batches and dropout are not those of
an uninterrupted run. A checkpoint whose optimizer state is split by rank (DeepSpeed's zero_pp_rank files:
ZeRO 1-3, and its bf16 optimizer on GPUs) is refused in one line that names both world sizes.
"""

import json
import random
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from bert_squad import distributed
from bert_squad.errors import UserError
from bert_squad.files import write_text_atomic

MARKER = "complete"


@dataclass
class Progress:
    """Where training stands: enough to continue with exactly the next batch."""

    step: int = 0  # optimizer steps done
    epoch: int = 0
    batch_in_epoch: int = 0  # micro batches of `epoch` already consumed on this rank


def checkpoint_root(output_dir):
    return Path(output_dir) / "checkpoints"


def _rng_state():
    """Every generator's state as tensors and numbers only, so it loads with `weights_only=True`
    (no unpickling of whatever a shared scratch directory holds)."""
    version, mt, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": [version, torch.tensor(mt, dtype=torch.int64), gauss],
             "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state):
    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt.tolist()), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save(engine, output_dir, progress, keep, dist):
    root = checkpoint_root(output_dir)
    tag = f"step{progress.step:08d}"
    engine.save_checkpoint(str(root), tag=tag, client_state={"progress": asdict(progress)}, save_latest=False)
    torch.save(_rng_state(), root / tag / f"rng_rank{dist.rank}.pt")
    distributed.barrier()  # every rank's files are on disk before the marker says so
    if dist.is_main:
        layout = {"world_size": dist.world_size, "train_batch_size": engine.train_batch_size(),
                  "gradient_accumulation_steps": engine.gradient_accumulation_steps()}
        write_text_atomic(root / tag / MARKER, json.dumps({**asdict(progress), **layout}) + "\n")
        write_text_atomic(root / "latest", tag + "\n")
        for old in complete_tags(root)[:-keep]:
            shutil.rmtree(root / old, ignore_errors=True)
    distributed.barrier()
    return root / tag


def complete_tags(root):
    tags = [p.name for p in Path(root).glob("step*") if re.fullmatch(r"step\d+", p.name) and (p / MARKER).exists()]
    return sorted(tags)


def find(resume, output_dir):
    """The checkpoint dir to resume from: None to start fresh (only with 'auto')."""
    if resume == "auto":
        root = checkpoint_root(output_dir)
        tags = complete_tags(root) if root.is_dir() else []
        return root / tags[-1] if tags else None
    path = Path(resume)
    if (path / "latest").is_file():
        path = path / (path / "latest").read_text().strip()
    if not (path / MARKER).is_file():
        raise UserError(f"{resume}: not a complete checkpoint (no '{MARKER}' marker); "
                        f"use --resume auto to pick the newest complete one")
    return path


def written_by(path):
    """The checkpoint's world size, global batch and accumulation (None each for older checkpoints)."""
    marker = json.loads((Path(path) / MARKER).read_text())
    return tuple(marker.get(k) for k in ("world_size", "train_batch_size", "gradient_accumulation_steps"))


def adapt(ds_config, path, world_size):
    """The DeepSpeed config to resume `path` with on `world_size` ranks: the checkpoint's global batch,
    kept by gradient accumulation when the world size changed; a UserError where that cannot be."""
    old_world, batch, _ = written_by(path)
    if old_world in (None, world_size):
        return ds_config
    if any(Path(path).glob("*zero_pp_rank_*")):
        raise UserError(f"{path}: written by {old_world} ranks, this run has {world_size}; its optimizer state is "
                        f"split by rank (ZeRO), so resume it on {old_world} ranks, or start afresh in "
                        f"another --output-dir")
    micro = ds_config["train_micro_batch_size_per_gpu"]
    if batch % (micro * world_size):
        raise UserError(f"{path}: written by {old_world} ranks with a global batch of {batch}, which "
                        f"{world_size} ranks x micro batch {micro} cannot keep by accumulation; resume on "
                        f"{old_world} ranks, or on a number of ranks that divides {batch // micro}")
    return dict(ds_config, gradient_accumulation_steps=batch // (micro * world_size), train_batch_size=batch)


def load(engine, path, dist):
    """Restore model, optimizer, scheduler, loss scale, progress and this rank's random state."""
    path = Path(path)
    load_path, client = engine.load_checkpoint(str(path.parent), tag=path.name)
    if load_path is None:
        raise UserError(f"{path}: DeepSpeed could not load this checkpoint")
    rng_file = path / f"rng_rank{dist.rank}.pt"
    if rng_file.exists():  # absent for ranks the checkpoint's world did not have
        _set_rng_state(torch.load(rng_file, weights_only=True))
    progress = Progress(**client["progress"])
    old_world, _, old_gas = written_by(path)
    if old_world not in (None, dist.world_size):  # the same optimizer steps, counted in this world's micro batches
        progress.batch_in_epoch = progress.batch_in_epoch // old_gas * engine.gradient_accumulation_steps()
    return progress
