"""DeepSpeed checkpoints that survive crashes, time limits and preemption.

A checkpoint is `<output-dir>/checkpoints/step<N>/`, written by DeepSpeed on every rank plus one RNG
file per rank and, last, a `complete` marker from rank 0 that also records the world size and batch.
`latest` is replaced atomically only after the marker exists, so a crash mid-save leaves the previous
checkpoint as the one to resume from.

A checkpoint is found once (`find`), with the layout its marker records; `dsconfig.resumed_batch` decides
from that layout how it resumes on another world size (a node lost, fewer ranks). From there on its
batches and dropout are not those of an uninterrupted run.
"""

import json
import random
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from bert_squad import distributed
from bert_squad.errors import UserError
from bert_squad.files import read_json, write_text_atomic

MARKER = "complete"


@dataclass(frozen=True)
class Layout:
    """How a checkpoint was written: what resuming it on another world size depends on."""

    world_size: Optional[int]  # None for checkpoints older than this record
    train_batch_size: Optional[int]
    accumulation: Optional[int]
    sharded: bool  # DeepSpeed split the optimizer state by rank (zero_pp_rank files: ZeRO 1-3, bf16 on GPUs)


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint directory and its layout, read once."""

    path: Path
    layout: Layout


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


def _read(path):
    marker = read_json(path / MARKER, what="a checkpoint marker")
    layout = Layout(marker.get("world_size"), marker.get("train_batch_size"),
                    marker.get("gradient_accumulation_steps"), any(path.glob("*zero_pp_rank_*")))
    return Checkpoint(path, layout)


def find(resume, output_dir):
    """The checkpoint to resume from: None to start fresh (only with 'auto')."""
    if resume == "auto":
        root = checkpoint_root(output_dir)
        tags = complete_tags(root) if root.is_dir() else []
        return _read(root / tags[-1]) if tags else None
    path = Path(resume)
    if (path / "latest").is_file():
        path = path / (path / "latest").read_text().strip()
    if not (path / MARKER).is_file():
        raise UserError(f"{resume}: not a complete checkpoint (no '{MARKER}' marker); "
                        f"use --resume auto to pick the newest complete one")
    return _read(path)


def load(engine, checkpoint, dist):
    """Restore model, optimizer, scheduler, loss scale, progress and this rank's random state."""
    path, layout = checkpoint.path, checkpoint.layout
    load_path, client = engine.load_checkpoint(str(path.parent), tag=path.name)
    if load_path is None:
        raise UserError(f"{path}: DeepSpeed could not load this checkpoint")
    rng_file = path / f"rng_rank{dist.rank}.pt"
    if rng_file.exists():  # absent for ranks the checkpoint's world did not have
        _set_rng_state(torch.load(rng_file, weights_only=True))
    progress = Progress(**client["progress"])
    if layout.world_size not in (None, dist.world_size):  # the same steps, counted in this world's micro batches
        progress.batch_in_epoch = progress.batch_in_epoch // layout.accumulation * engine.gradient_accumulation_steps()
    return progress
