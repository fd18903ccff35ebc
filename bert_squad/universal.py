"""Resuming a checkpoint on another number of ranks (a node lost, or more nodes free later).

ZeRO stage 0 (ds_fp32, ds_bf16) keeps the whole optimizer state in one file that every rank loads:
such a checkpoint resumes on any world size as it is. ZeRO stages 1-3 split it by rank (DeepSpeed's
zero_pp_rank files), and DeepSpeed refuses such a checkpoint on another world size; its universal
checkpoint code (deepspeed/checkpoint/ds_to_universal.py, run here in-process) turns the shards into
one fp32 weight and Adam moment file per parameter, which a run with `checkpoint.load_universal`
partitions for its own world. Either way the global batch is kept by gradient accumulation.

The conversion is done once, by rank 0, into `step<N>/universal/` inside the checkpoint (written under
a temporary name, then renamed, with its own file list in a `complete` marker), and later resumes reuse it.

    plan(layout, world_size, ds_config) -> Plan       what to do; pure, no files touched
    configure(ds_config, plan, path) -> ds_config     the refusal as a UserError; accumulation, load_universal
    prepare(path, plan, dist) -> (dir, tag, note)      where DeepSpeed loads from; converts if needed
"""

import contextlib
import io
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

from bert_squad import checkpoint, distributed, dsconfig
from bert_squad.errors import UserError

UNIVERSAL = "universal"  # the conversion's directory inside the checkpoint

AS_IS, ACCUMULATE, CONVERT, REFUSE = "as is", "accumulate", "universal", "refuse"


@dataclass(frozen=True)
class Plan:
    """How a checkpoint resumes in this world: AS_IS (same world), ACCUMULATE (the optimizer state is
    whole: load it, keep the batch by accumulation), CONVERT (shards: universal checkpoint, and
    accumulation) or REFUSE (`reason` says why)."""

    action: str
    accumulation: Optional[int] = None
    train_batch_size: Optional[int] = None
    reason: Optional[str] = None


def plan(layout, world_size, ds_config):
    """What resuming a checkpoint written as `layout` takes on `world_size` ranks with `ds_config`."""
    stage, precision = dsconfig.zero_stage(ds_config), dsconfig.precision(ds_config)
    if (layout.zero_stage, layout.precision) not in ((None, None), (stage, precision)):
        return Plan(REFUSE, reason=f"written with ZeRO stage {layout.zero_stage} in {layout.precision}, this run's "
                                   f"DeepSpeed config has stage {stage} in {precision}; resume with the config "
                                   f"it was written with")
    if layout.world_size in (None, world_size):
        return Plan(AS_IS, ds_config["gradient_accumulation_steps"], ds_config["train_batch_size"])
    batch, micro = layout.train_batch_size, ds_config["train_micro_batch_size_per_gpu"]
    if batch % (micro * world_size):
        return Plan(REFUSE, reason=f"written by {_ranks(layout.world_size)} with a global batch of {batch}, which "
                                   f"{_ranks(world_size)} x micro batch {micro} cannot keep by accumulation; "
                                   f"resume on {_ranks(layout.world_size)}, or on a number of ranks that divides "
                                   f"{batch // micro}")
    offload = ds_config.get("zero_optimization", {}).get("offload_optimizer", {}).get("device")
    if layout.sharded and offload == "nvme":
        return Plan(REFUSE, reason=f"written by {_ranks(layout.world_size)}, this run has {world_size}; DeepSpeed "
                                   f"loads no universal checkpoint with the optimizer offloaded to NVMe "
                                   f"(engine.load_checkpoint skips it); resume on {_ranks(layout.world_size)}")
    return Plan(CONVERT if layout.sharded else ACCUMULATE, batch // (micro * world_size), batch)


def configure(ds_config, resume_plan, path):
    """The DeepSpeed config to resume `path` with; a UserError for a refusal, or where a conversion
    is needed and the checkpoint cannot be written."""
    if resume_plan.action == REFUSE:
        raise UserError(f"{path}: {resume_plan.reason}")
    if resume_plan.action == AS_IS:
        return ds_config
    if resume_plan.action == CONVERT and not _converted(path):
        _check_writable(path)
    world_batch = dict(gradient_accumulation_steps=resume_plan.accumulation,
                       train_batch_size=resume_plan.train_batch_size)
    if resume_plan.action == ACCUMULATE:
        return dict(ds_config, **world_batch)
    return dict(ds_config, **world_batch, checkpoint=dict(ds_config.get("checkpoint", {}), load_universal=True))


def _converted(path):
    return (Path(path) / UNIVERSAL / checkpoint.MARKER).is_file()


def _check_writable(path):
    probe = Path(path) / f".write-test-{os.getpid()}"
    try:
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise UserError(f"{path}: resuming it on another number of ranks converts its ZeRO optimizer shards "
                        f"into a universal checkpoint inside it, and it cannot be written ({err.strerror}); "
                        f"copy the checkpoint somewhere writable and resume from the copy") from None


def prepare(path, resume_plan, dist):
    """(directory, tag, note) DeepSpeed loads from: the checkpoint itself, or its universal conversion,
    made by rank 0 (or reused) while the other ranks wait; `note` says which."""
    path = Path(path)
    if resume_plan.action != CONVERT:
        return path.parent, path.name, ""
    outcome = None
    if dist.is_main:
        try:
            outcome = ("ok", convert_once(path))
        except UserError as err:
            outcome = ("error", str(err))
    status, note = distributed.broadcast_from_rank0(outcome)
    if status == "error":
        raise UserError(note)
    return path, UNIVERSAL, note


def convert_once(path):
    """Convert the checkpoint at `path` into `path/universal` unless an intact conversion is there; says which."""
    target, redone = Path(path) / UNIVERSAL, ""
    if _converted(path):
        problem = checkpoint.damage(target)
        if problem is None:
            return "reused its conversion"
        shutil.rmtree(target)
        redone = f"; the one there was damaged: {problem}"
    tmp = Path(path) / f".{UNIVERSAL}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        t0 = time.perf_counter()
        _ds_to_universal(path, tmp / UNIVERSAL)
        checkpoint.write_marker(tmp / UNIVERSAL, {}, checkpoint.manifest(tmp / UNIVERSAL))
        seconds = time.perf_counter() - t0
        with contextlib.suppress(OSError):  # another job converted it meanwhile: theirs is as good
            os.replace(tmp / UNIVERSAL, target)
    except OSError as err:
        raise UserError(f"{path}: cannot write its universal conversion ({err.strerror or err})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return f"converted in {seconds:.1f} s{redone}"


def _ds_to_universal(path, out):
    """DeepSpeed's converter, in this process (one worker: no process pool forked from a rank), quiet."""
    from deepspeed.checkpoint import ds_to_universal

    args = SimpleNamespace(input_folder=str(path), output_folder=str(out), num_extract_workers=1,
                           num_merge_workers=1, keep_temp_folder=False, strict=True,
                           inject_missing_state=True)  # stage 1-2 checkpoints of a plain model lack its info
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            ds_to_universal.main(args)
    except Exception as err:  # whatever the converter trips on, it is why this checkpoint does not convert
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(f"{path}: DeepSpeed cannot convert it to a universal checkpoint: {reason}") from None


def describe(found, progress, resume_plan, world_size, note):
    """The log line of a resume: from where, and how a changed world size was met."""
    line = f"resumed from {found.path} at step {progress.step}"
    if resume_plan.action == AS_IS:
        return line
    how = f"universal checkpoint ({note})" if resume_plan.action == CONVERT else "optimizer state whole (ZeRO stage 0)"
    return (f"{line}, written by {_ranks(found.layout.world_size)}, on {_ranks(world_size)}: {how}, accumulation "
            f"{resume_plan.accumulation} keeps the global batch of {resume_plan.train_batch_size}; from here the "
            f"batches and dropout differ from an uninterrupted run")


def _ranks(n):
    return f"{n} rank" if n == 1 else f"{n} ranks"
