"""DeepSpeed checkpoints that survive crashes, time limits, preemption and damage.

A checkpoint is `<output-dir>/checkpoints/step<N>/`: DeepSpeed's files from every rank, one RNG file
per rank, `hf/` (the model's config and tokenizer: with the weights, all an export needs) and, last,
a `complete` marker from rank 0. The marker records the progress, how the checkpoint was written
(world size, batch, ZeRO stage, precision), what it is of (model fingerprint, windows) and every file
with its size and CRC-32, computed by the rank that wrote the file right after writing it (and
fsynced first: "complete" means on disk). `latest` is replaced atomically only after the marker
exists, so a crash mid-save leaves the previous checkpoint as the one to resume from.

Damage after the marker (a scratch quota full mid-copy, a truncated file, a purged shard) is found
before DeepSpeed reads anything: `find` checks a checkpoint against its marker, and `--resume auto`
falls back to the one before. Older checkpoints are deleted only after a newer one is complete, and
`--keep-checkpoints` counts intact ones.

How a checkpoint resumes in another world is resume.py's part.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import re
import shutil
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from bert_squad import distributed, model, outputs
from bert_squad.errors import UserError
from bert_squad.files import write_text_atomic

if TYPE_CHECKING:  # transformers loads with the model, not for the commands that only read checkpoints
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

    from bert_squad.distributed import DistEnv
    from bert_squad.dsconfig import Settings
    from bert_squad.task import Task

MARKER = "complete"
HF_DIR = "hf"
_CHUNK = 16 << 20
_SHARD = re.compile(r"zero_pp_rank_\d+_mp_rank_\d+_optim_states\.pt$")


@dataclass
class Progress:
    """Where training stands: enough to continue with exactly the next batch."""

    step: int = 0  # optimizer steps done
    epoch: int = 0
    batch_in_epoch: int = 0  # micro batches of `epoch` already consumed on this rank


@dataclass(frozen=True)
class Layout:
    """How a checkpoint was written: what resuming it on another world size depends on (None: written
    before the marker recorded it)."""

    world_size: int | None = None
    train_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    zero_stage: int | None = None
    precision: str | None = None
    sharded: bool = False  # DeepSpeed split the optimizer state by rank (its zero_pp_rank files: ZeRO 1-3)
    precision_path: str | None = None  # dsconfig.Reading.precision_path: 16-bit weights, or autocast over fp32
    optimizer: str | None = None  # the optimizer class the engine stepped, and its wrapper (recorded at save)


@dataclass(frozen=True)
class Resumable:
    """A checkpoint to resume from, checked against its marker."""

    path: Path
    layout: Layout
    skipped: tuple[str, ...] = ()  # one line for each newer checkpoint passed over as damaged


@dataclass(frozen=True)
class Stamp:
    """What every checkpoint of a run records of it: what it is of (checked when resuming) and how it was
    written (which decides how it resumes in another world)."""

    model: str  # --model as given, for messages
    fingerprint: str  # parameter names and shapes, and the tokenizer's vocabulary
    windows: dict[str, int]  # the window options the data position counts in
    config: PretrainedConfig  # written with the tokenizer and the task into hf/
    tokenizer: PreTrainedTokenizerBase
    task: Task
    layout: Layout


def stamp(
    model_name: str,
    module: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    trained: Task,
    settings: Settings,
) -> Stamp:
    """The stamp of checkpoints of `module` (loaded from `model_name`) with `tokenizer`, trained for `trained`
    (whose windows the data position counts in), written with the DeepSpeed `settings`."""
    shapes = [(name, list(p.shape)) for name, p in module.named_parameters()]
    vocab = sorted(tokenizer.get_vocab().items())
    fingerprint = hashlib.sha256(json.dumps([shapes, vocab]).encode()).hexdigest()[:16]
    b = settings.batch
    written = Layout(
        b.world_size,
        b.size,
        b.accumulation,
        settings.zero_stage,
        settings.precision,
        precision_path=settings.precision_path,
    )
    windows = dataclasses.asdict(trained.windows)
    return Stamp(str(model_name), fingerprint, windows, module.config, tokenizer, trained, written)


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / outputs.CHECKPOINTS


def _rng_state() -> dict[str, Any]:
    """Every generator's state as tensors and numbers only, so it loads with `weights_only=True`
    (no unpickling of whatever a shared scratch directory holds)."""
    version, mt, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = cast(tuple, np.random.get_state())  # the legacy tuple, by default
    state = {
        "python": [version, torch.tensor(mt, dtype=torch.int64), gauss],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt.tolist()), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# --- the file list in the marker -----------------------------------------------------------------


def _digest(path: Path, sync: bool = False) -> list[int]:
    """[size, CRC-32] of a file (zlib's CRC: a fraction of what writing the file cost); with `sync`,
    flushed to disk first."""
    crc = size = 0
    with open(path, "rb") as f:
        if sync:
            os.fsync(f.fileno())
        while chunk := f.read(_CHUNK):
            crc, size = zlib.crc32(chunk, crc), size + len(chunk)
    return [size, crc]


def _files(directory: str | Path) -> list[str]:
    """Every file below `directory` but its marker, as paths relative to it."""
    directory = Path(directory)
    names = (p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())
    return sorted(n for n in names if n != MARKER)


def _writer(name: str) -> int:
    """The rank that wrote a file: DeepSpeed and `save` name per-rank files by rank; the rest is rank 0's."""
    m = re.search(r"(?:zero_pp_rank_|rng_rank)(\d+)", name)
    return int(m.group(1)) if m else 0


def manifest(directory: str | Path, rank: int = 0, world_size: int = 1, sync: bool = False) -> dict[str, list[int]]:
    """{file: [size, crc]} of the files of `directory` that `rank` of `world_size` wrote (all, by default)."""
    return {n: _digest(Path(directory) / n, sync) for n in _files(directory) if _writer(n) % world_size == rank}


def _marker(path: str | Path) -> dict[str, Any] | None:
    """The marker's record; None where it cannot be read as one."""
    try:
        record = json.loads((Path(path) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def describe_damage(path: str | Path, read: bool = True) -> str | None:
    """What is wrong with the checkpoint at `path`, compared with its marker: a few words that name the
    file, or None when it is intact (or its marker predates file lists). `read=False` checks sizes only."""
    marker = _marker(path)
    if marker is None:
        return f"its '{MARKER}' marker is unreadable"
    for name, (size, crc) in marker.get("files", {}).items():
        f = Path(path) / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != size:
            return f"{name} is {f.stat().st_size} bytes, the marker recorded {size}"
        if read and _digest(f)[1] != crc:
            return f"{name} differs from the marker's checksum"
    return None


def write_marker(path: str | Path, record: dict[str, Any], files: dict[str, list[int]]) -> None:
    write_text_atomic(Path(path) / MARKER, json.dumps({**record, "files": files}) + "\n")


# --- save -----------------------------------------------------------------------------------------


def optimizer_classes(engine: Any) -> tuple[str | None, str | None]:
    """The optimizer class the engine steps (None: none built) and the DeepSpeed wrapper around it for 16-bit
    weights or ZeRO (None: the engine steps the optimizer itself)."""
    basic, built = engine.basic_optimizer, engine.optimizer
    name = f"{type(basic).__module__}.{type(basic).__qualname__}" if basic is not None else None
    return name, None if built is basic else type(built).__name__


def optimizer_name(engine: Any) -> str:
    """The optimizer the engine steps in one string, as a checkpoint's marker records it."""
    name, wrapper = optimizer_classes(engine)
    return f"{name or 'none'} in {wrapper}" if wrapper else name or "none"


def _mark_complete(path: Path, parts: list[Any], progress: Progress, stamp: Stamp, optimizer: str) -> None:
    """Rank 0's marker over every rank's (digests, write seconds, digest seconds): what the checkpoint holds,
    how it was written, and the slowest rank's times."""
    files = dict(sorted(kv for part, _, _ in parts for kv in part.items()))
    seconds = {"write": max(p[1] for p in parts), "digest": max(p[2] for p in parts)}
    layout = dataclasses.replace(stamp.layout, optimizer=optimizer)
    written = {k: v for k, v in asdict(layout).items() if k != "sharded"}  # sharded: by its files
    about = {
        **asdict(progress),
        **written,
        "model": stamp.model,
        "fingerprint": stamp.fingerprint,
        "windows": stamp.windows,
        "seconds": seconds,
    }
    write_marker(path, about, files)


def save(
    engine: Any,
    output_dir: str | Path,
    progress: Progress,
    keep: int,
    dist: DistEnv,
    stamp: Stamp,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Every rank writes its files and their digests; rank 0 then marks the checkpoint complete, points
    `latest` at it and deletes the checkpoints `keep` no longer covers. `extra(path)`: what else rank 0
    writes into the checkpoint (before the digests, so they cover it)."""
    root = checkpoint_root(output_dir)
    tag = f"step{progress.step:08d}"
    path, superseded = root / tag, root / f".superseded-{tag}"
    if dist.is_main and path.exists():
        # This step's checkpoint from before a resume from an older one: none of its files (another world's
        # shards, a universal conversion) may mix with the new ones; it goes once the new one is complete.
        shutil.rmtree(superseded, ignore_errors=True)
        os.replace(path, superseded)
    distributed.barrier()
    t0 = time.perf_counter()
    client = {"progress": asdict(progress)}
    scaler = engine.torch_autocast_z0_gradscaler  # fp16 autocast's loss scaler, which DeepSpeed does not save
    if scaler is not None:
        client["grad_scaler"] = scaler.state_dict()  # the scale and its growth tracker
    engine.save_checkpoint(str(root), tag=tag, client_state=client, save_latest=False)
    torch.save(_rng_state(), path / f"rng_rank{dist.rank}.pt")
    if dist.is_main:
        stamp.config.save_pretrained(str(path / HF_DIR))
        model.save_tokenizer(stamp.tokenizer, path / HF_DIR)
        stamp.task.write(path / HF_DIR)
        if extra is not None:
            extra(path)
    t1 = time.perf_counter()
    mine = manifest(path, dist.rank, dist.world_size, sync=True)
    # A collective: once rank 0 has every rank's digests, every rank's files are on disk.
    parts = distributed.gather_to_rank0((mine, t1 - t0, time.perf_counter() - t1), dist)
    if dist.is_main:
        assert parts is not None  # rank 0 gathered them
        _mark_complete(path, parts, progress, stamp, optimizer_name(engine))
        write_text_atomic(root / "latest", tag + "\n")
        shutil.rmtree(superseded, ignore_errors=True)
        prune(root, keep)
    distributed.barrier()
    return path


def complete_tags(root: str | Path) -> list[str]:
    tags = [p.name for p in Path(root).glob("step*") if re.fullmatch(r"step\d+", p.name) and (p / MARKER).exists()]
    return sorted(tags)


def prune(root: str | Path, keep: int) -> None:
    """Delete the complete checkpoints older than the newest `keep` intact ones, damaged ones included;
    intact here means every file there at its recorded size (nothing is read)."""
    tags = complete_tags(root)
    kept = [t for t in tags if describe_damage(Path(root) / t, read=False) is None][-keep:]
    for tag in tags:
        if kept and tag < kept[-1] and tag not in kept:
            shutil.rmtree(Path(root) / tag, ignore_errors=True)


# --- find and load --------------------------------------------------------------------------------


def layout(path: str | Path) -> Layout:
    """How the checkpoint at `path` was written, from its marker (and its file names)."""
    marker = _marker(path) or {}
    names = marker.get("files") or [p.name for p in Path(path).iterdir()]
    fields = [f.name for f in dataclasses.fields(Layout) if f.name != "sharded"]
    return Layout(**{k: marker.get(k) for k in fields}, sharded=any(_SHARD.search(n) for n in names))


def find(resume: str, output_dir: str | Path) -> Resumable | None:
    """The checkpoint `--resume` names, checked against its marker; None to start fresh (only with 'auto')."""
    if resume == "auto":
        root = checkpoint_root(output_dir)
        return _newest_intact(root, complete_tags(root) if root.is_dir() else [])
    return intact_at(resume, hint="; use --resume auto to pick the newest complete one")


def intact_at(where: str | Path, hint: str = "") -> Resumable:
    """The checkpoint at `where` (a step<N> directory, or one with `latest`), checked against its marker."""
    path = Path(where)
    if (path / "latest").is_file():
        path = path / (path / "latest").read_text().strip()
    if checkpoint_root(path).is_dir() and not (path / MARKER).is_file():
        raise UserError(
            f"{where}: a run's output dir, not a checkpoint: give {checkpoint_root(path)} (its newest checkpoint) "
            f"or one of its step<N>"
        )
    if not path.exists():
        tags = complete_tags(path.parent) if path.parent.is_dir() else []
        there = f"checkpoints there: {', '.join(tags)}" if tags else f"{path.parent} holds no complete checkpoint"
        raise UserError(f"{where}: no such checkpoint ({there})")
    if not (path / MARKER).is_file():
        raise UserError(f"{where}: not a complete checkpoint (no '{MARKER}' marker){hint}")
    problem = describe_damage(path)
    if problem:
        raise UserError(
            f"{path}: damaged checkpoint: {problem}; take another one (--resume auto takes the newest intact one)"
        )
    return Resumable(path, layout(path))


def _newest_intact(root: Path, tags: list[str]) -> Resumable | None:
    damaged: list[tuple[str, str]] = []
    for tag in reversed(tags):
        problem = describe_damage(root / tag)
        if problem is None:
            skipped = tuple(f"{root / t}: damaged checkpoint: {p}; resuming from {tag} instead" for t, p in damaged)
            return Resumable(root / tag, layout(root / tag), skipped)
        damaged.append((tag, problem))
    if damaged:
        tag, problem = damaged[0]
        raise UserError(
            f"{root}: every complete checkpoint is damaged (the newest, {tag}: {problem}); "
            f"move them away to start afresh"
        )
    return None


def check_matches(found: Resumable, stamp: Stamp) -> None:
    """A UserError unless the checkpoint is of this run's model and windows (when its marker says)."""
    marker = _marker(found.path) or {}
    if marker.get("fingerprint") not in (None, stamp.fingerprint):
        raise UserError(
            f"{found.path}: a checkpoint of another model ({marker['model']}): its parameters or "
            f"vocabulary differ from --model {stamp.model}'s; resume it with that --model, or "
            f"start afresh in another --output-dir"
        )
    for key, value in marker.get("windows", {}).items():
        if stamp.windows.get(key) != value:
            flag = "--" + key.replace("_", "-")
            raise UserError(
                f"{found.path}: written with {flag} {value}, this run has {stamp.windows.get(key)}: "
                f"its data position counts those windows; resume with {flag} {value}, or start "
                f"afresh in another --output-dir"
            )


def load(engine: Any, found: Resumable, dist: DistEnv, source: tuple[Path, str] | None = None) -> Progress:
    """Restore model, optimizer, scheduler, loss scale, progress and this rank's random state. `source`:
    the (directory, tag) DeepSpeed reads, where not the checkpoint itself (its universal conversion)."""
    path = found.path
    load_dir, tag = source or (path.parent, path.name)
    if found.layout.optimizer not in (None, optimizer_name(engine)):
        raise UserError(
            f"{path}: written by the optimizer {found.layout.optimizer}, this run's engine steps "
            f"{optimizer_name(engine)}; resume with the DeepSpeed config it was written with"
        )
    hyper = [{k: v for k, v in g.items() if k not in ("params", "lr")} for g in engine.optimizer.param_groups]
    load_path, client = engine.load_checkpoint(str(load_dir), tag=tag)
    if load_path is None:
        raise UserError(f"{path}: DeepSpeed could not load this checkpoint")
    if engine.load_universal_checkpoint():
        # DeepSpeed's ZeRO-3 universal load gives every group the first group's hyperparameters (weight
        # decay on biases and LayerNorm; stage3.py, load_hp_checkpoint_state_from_checkpoint_dir_stage3).
        for group, own in zip(engine.optimizer.param_groups, hyper):
            group.update(own)
    scaler = engine.torch_autocast_z0_gradscaler
    if scaler is not None:  # the marker's precision path says the checkpoint has it (`check_matches`)
        scaler.load_state_dict(client["grad_scaler"])
    rng_file = path / f"rng_rank{dist.rank}.pt"
    if rng_file.exists():  # absent for ranks the checkpoint's world did not have
        _set_rng_state(torch.load(rng_file, weights_only=True))
    return Progress(**client["progress"])
