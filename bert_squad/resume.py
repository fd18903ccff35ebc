"""Resuming a checkpoint in this run's world, with one owner: how it resumes, the conversion it needs, and
the position it continues from.

`decide` compares how a checkpoint was written (`checkpoint.Layout`) with this run's DeepSpeed settings:
- the same world size: as it is;
- another world size, ZeRO stage 0: the optimizer state is whole in one file every rank loads, so it
  loads as it is (WHOLE);
- another world size, ZeRO 1-3: the optimizer state is split by rank (DeepSpeed's zero_pp_rank files),
  which DeepSpeed refuses on another world; its universal checkpoint code (deepspeed/checkpoint/
  ds_to_universal.py, run here in-process) turns the shards into one fp32 weight and Adam moment file per
  parameter, which a run with `checkpoint.load_universal` partitions for its own world (UNIVERSAL).
Either way the checkpoint's global batch is kept (`dsconfig.Batch.keeping`: accumulation first, a smaller
micro batch where the world grew); a batch that cannot be split over the ranks, another ZeRO stage or
precision, or an optimizer offloaded to NVMe (DeepSpeed loads no universal checkpoint then) is refused
in one line before any rank starts.

The conversion is done once, by rank 0, into `step<N>/universal/` inside the checkpoint (written under a
temporary name, then renamed, with its own file list in a `complete` marker); later resumes reuse it.
`load` restores the engine and random state (`checkpoint.load`) and rescales the data position into this
world's micro batches.
"""

import contextlib
import io
import os
import shutil
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from bert_squad import checkpoint, distributed, dsconfig, report
from bert_squad.errors import UserError, first_line
from bert_squad.files import PathLike, probe_write, scratch

if TYPE_CHECKING:  # DeepSpeed loads with the run
    from deepspeed import DeepSpeedEngine

AS_IS, WHOLE, UNIVERSAL = "as is", "whole", "universal"


@dataclass(frozen=True)
class Decision:
    """How the checkpoint a run continues resumes in this world, and the settings the run takes for it."""

    found: checkpoint.Resumable
    action: str  # AS_IS, WHOLE or UNIVERSAL
    settings: dsconfig.Settings  # the run's, with the checkpoint's global batch kept


def ranks(n: int) -> str:
    """'1 rank', '4 ranks': how messages count ranks."""
    return f"{n} rank" if n == 1 else f"{n} ranks"


def decide(found: checkpoint.Resumable, settings: dsconfig.Settings) -> Decision:
    """How `found` resumes with `settings` in their world; a UserError naming both sides where it cannot."""
    layout, batch, path = found.layout, settings.batch, found.path
    if (layout.zero_stage, layout.precision) not in ((None, None), (settings.zero_stage, settings.precision)):
        raise UserError(
            f"{path}: written with ZeRO stage {layout.zero_stage} in {layout.precision}, this run's "
            f"DeepSpeed config has stage {settings.zero_stage} in {settings.precision}; resume with "
            f"the config it was written with"
        )
    _check_precision_path(found, settings)
    if layout.world_size is None or layout.world_size == batch.world_size:
        return Decision(found, AS_IS, settings)
    assert layout.train_batch_size is not None  # the marker records it with the world size
    old = ranks(layout.world_size)
    kept = batch.keeping(layout.train_batch_size)
    if kept is None:
        raise UserError(
            f"{path}: written by {old} with a global batch of {layout.train_batch_size}, which "
            f"{ranks(batch.world_size)} cannot split evenly; resume on a number of ranks that "
            f"divides {layout.train_batch_size}"
        )
    offload = settings.reading.offload("offload_optimizer")
    if layout.sharded and offload is not None and offload.device == "nvme":
        raise UserError(
            f"{path}: written by {old}, this run has {batch.world_size}; DeepSpeed loads no universal "
            f"checkpoint with the optimizer offloaded to NVMe (engine.load_checkpoint skips it); "
            f"resume on {old}"
        )
    if layout.sharded:
        _check_universal_load(found, settings)
    if layout.sharded and not _converted(path):
        _check_writable(path)
    action = UNIVERSAL if layout.sharded else WHOLE
    return Decision(found, action, settings.resuming(kept, load_universal=action == UNIVERSAL))


# DeepSpeed loads a universal checkpoint below ZeRO stage 3 (its ZeRO-1/2 and 16-bit optimizers) with each
# parameter's fp32 weight mapped onto the last Adam moment it loaded before 0.19.7 (map_to_flat_opt_states in
# deepspeed/utils/tensor_fragment.py, 0.19.6 against 0.19.7): the optimizer steps on, but the fp32 weights DeepSpeed
# hands out, which the export takes, are that moment's.
UNIVERSAL_BELOW_STAGE3_SINCE = "0.19.7"


def _check_universal_load(found: checkpoint.Resumable, settings: dsconfig.Settings) -> None:
    """A UserError where the installed DeepSpeed cannot load `found` through a universal checkpoint in this world
    as it was saved."""
    from packaging.version import Version  # with DeepSpeed, which requires it

    have = version("deepspeed")
    if settings.zero_stage < 3 and Version(have) < Version(UNIVERSAL_BELOW_STAGE3_SINCE):
        raise UserError(
            f"{found.path}: written by {ranks(found.layout.world_size or 0)}, this run has "
            f"{ranks(settings.batch.world_size)}: resuming ZeRO stage {settings.zero_stage} in {settings.precision} "
            f"on another number of ranks needs DeepSpeed {UNIVERSAL_BELOW_STAGE3_SINCE} or later (this is {have}, "
            f"whose universal checkpoint loads the fp32 weights wrong); resume on {ranks(found.layout.world_size or 0)}"
        )


def _check_precision_path(found: checkpoint.Resumable, settings: dsconfig.Settings) -> None:
    """A UserError naming both paths where the checkpoint's precision path is not this run's. A 16-bit
    checkpoint whose marker predates the record may be of either path, which nothing else tells apart."""
    written, path = found.layout, found.path
    if written.precision_path == settings.precision_path or written.precision in (None, "fp32"):
        return
    was = written.precision_path or f"{written.precision}, by a version that did not record its precision path"
    raise UserError(
        f"{path}: written with {was}, this run computes in {settings.precision_path}: their optimizer states "
        f"differ; resume with the version and DeepSpeed config that wrote it, or start afresh in another --output-dir"
    )


def load(engine: "DeepSpeedEngine", decision: Decision, dist: distributed.DistEnv) -> checkpoint.Progress:
    """The checkpoint's weights, optimizer state, random state and position, loaded (from its universal
    conversion, made now or before, where that is how it resumes); says so in the log."""
    found, batch = decision.found, decision.settings.batch
    load_dir, tag, note = _source(decision, dist)
    progress = checkpoint.load(engine, found, dist, (load_dir, tag))
    old = found.layout
    line = f"resumed from {found.path} at step {progress.step}"
    if decision.action != AS_IS:  # the same optimizer steps, counted in this world's micro batches
        assert old.world_size and old.gradient_accumulation_steps  # `decide` resumes as is where unrecorded
        progress.batch_in_epoch = progress.batch_in_epoch // old.gradient_accumulation_steps * batch.accumulation
        how = (
            f"universal checkpoint ({note})" if decision.action == UNIVERSAL else "optimizer state whole (ZeRO stage 0)"
        )
        line += (
            f", written by {ranks(old.world_size)}, on {ranks(batch.world_size)}: {how}, micro batch {batch.micro} "
            f"x accumulation {batch.accumulation} keeps the global batch of {batch.size}; from here the batches "
            f"and dropout differ from an uninterrupted run"
        )
    report.log(dist, line)
    return progress


DIR = "universal"  # the conversion's directory inside the checkpoint


def _converted(path: PathLike) -> bool:
    return (Path(path) / DIR / checkpoint.MARKER).is_file()


def _check_writable(path: Path) -> None:
    try:
        probe_write(path)
    except OSError as err:
        raise UserError(
            f"{path}: resuming it on another number of ranks converts its ZeRO optimizer shards "
            f"into a universal checkpoint inside it, and it cannot be written ({err.strerror}); "
            f"copy the checkpoint somewhere writable and resume from the copy"
        ) from None


def _source(decision: Decision, dist: distributed.DistEnv) -> tuple[Path, str, str]:
    """(directory, tag, note) DeepSpeed loads from: the checkpoint itself, or its universal conversion, made by
    rank 0 (or reused) while the other ranks wait; `note` says which."""
    path = Path(decision.found.path)
    if decision.action != UNIVERSAL:
        return path.parent, path.name, ""
    outcome = ("", "")  # rank 0's is broadcast: the others' is a placeholder
    if dist.is_main:
        try:
            outcome = ("ok", convert_once(path))
        except UserError as err:
            outcome = ("error", str(err))
    status, note = distributed.broadcast_from_rank0(outcome)
    if status == "error":
        raise UserError(note)
    return path, DIR, note


def convert_once(path: PathLike) -> str:
    """Convert the checkpoint at `path` into `path/universal` unless an intact conversion is there; says which."""
    target, redone = Path(path) / DIR, ""
    if _converted(path):
        problem = checkpoint.describe_damage(target)
        if problem is None:
            return "reused its conversion"
        shutil.rmtree(target)
        redone = f"; the one there was damaged: {problem}"
    try:
        tmp = scratch(path, DIR, directory=True)
        try:
            t0 = time.perf_counter()
            _ds_to_universal(path, tmp / DIR)
            checkpoint.write_marker(tmp / DIR, {}, checkpoint.manifest(tmp / DIR))
            seconds = time.perf_counter() - t0
            with contextlib.suppress(OSError):  # another job converted it meanwhile: theirs is as good
                os.replace(tmp / DIR, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as err:
        raise UserError(f"{path}: cannot write its universal conversion ({err.strerror or err})") from None
    return f"converted in {seconds:.1f} s{redone}"


def _ds_to_universal(path: PathLike, out: Path) -> None:
    """DeepSpeed's converter, in this process (one worker: no process pool forked from a rank), quiet."""
    from deepspeed.checkpoint import ds_to_universal  # heavy: only a resume that converts needs it

    args = SimpleNamespace(
        input_folder=str(path),
        output_folder=str(out),
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,
    )  # stage 1-2 checkpoints of a plain model lack its info
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            ds_to_universal.main(args)
    except Exception as err:  # whatever the converter trips on, it is why this checkpoint does not convert
        raise UserError(f"{path}: DeepSpeed cannot convert it to a universal checkpoint: {first_line(err)}") from None
