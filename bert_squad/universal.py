"""Resuming ZeRO shards on another number of ranks: DeepSpeed's universal checkpoint, converted once.

ZeRO stages 1-3 split the optimizer state by rank (DeepSpeed's zero_pp_rank files), and DeepSpeed refuses
such a checkpoint on another world size; its universal checkpoint code (deepspeed/checkpoint/
ds_to_universal.py, run here in-process) turns the shards into one fp32 weight and Adam moment file per
parameter, which a run with `checkpoint.load_universal` partitions for its own world. Whether a resume needs
it, and with which batch, is `dsconfig.resume_plan`'s decision; this module does the conversion.

The conversion is done once, by rank 0, into `step<N>/universal/` inside the checkpoint (written under
a temporary name, then renamed, with its own file list in a `complete` marker), and later resumes reuse it.
"""

import contextlib
import io
import os
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

from bert_squad import checkpoint, distributed, dsconfig
from bert_squad.errors import UserError

DIR = "universal"  # the conversion's directory inside the checkpoint


def check_convertible(path):
    """Before any rank starts: a checkpoint that must be converted, and is not yet, can be written."""
    if not _converted(path):
        _check_writable(path)


def _converted(path):
    return (Path(path) / DIR / checkpoint.MARKER).is_file()


def _check_writable(path):
    probe = Path(path) / f".write-test-{os.getpid()}"
    try:
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise UserError(f"{path}: resuming it on another number of ranks converts its ZeRO optimizer shards "
                        f"into a universal checkpoint inside it, and it cannot be written ({err.strerror}); "
                        f"copy the checkpoint somewhere writable and resume from the copy") from None


def prepare(path, resume, dist):
    """(directory, tag, note) DeepSpeed loads from for `resume` (a `dsconfig.Resume`): the checkpoint itself,
    or its universal conversion, made by rank 0 (or reused) while the other ranks wait; `note` says which."""
    path = Path(path)
    if resume.action != dsconfig.UNIVERSAL:
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
    return path, DIR, note


def convert_once(path):
    """Convert the checkpoint at `path` into `path/universal` unless an intact conversion is there; says which."""
    target, redone = Path(path) / DIR, ""
    if _converted(path):
        problem = checkpoint.damage(target)
        if problem is None:
            return "reused its conversion"
        shutil.rmtree(target)
        redone = f"; the one there was damaged: {problem}"
    tmp = Path(path) / f".{DIR}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        t0 = time.perf_counter()
        _ds_to_universal(path, tmp / DIR)
        checkpoint.write_marker(tmp / DIR, {}, checkpoint.manifest(tmp / DIR))
        seconds = time.perf_counter() - t0
        with contextlib.suppress(OSError):  # another job converted it meanwhile: theirs is as good
            os.replace(tmp / DIR, target)
    except OSError as err:
        raise UserError(f"{path}: cannot write its universal conversion ({err.strerror or err})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return f"converted in {seconds:.1f} s{redone}"


def _ds_to_universal(path, out):
    """DeepSpeed's converter, in this process (one worker: no process pool forked from a rank), quiet."""
    from deepspeed.checkpoint import ds_to_universal  # heavy: only a resume that converts needs it

    args = SimpleNamespace(input_folder=str(path), output_folder=str(out), num_extract_workers=1,
                           num_merge_workers=1, keep_temp_folder=False, strict=True,
                           inject_missing_state=True)  # stage 1-2 checkpoints of a plain model lack its info
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            ds_to_universal.main(args)
    except Exception as err:  # whatever the converter trips on, it is why this checkpoint does not convert
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(f"{path}: DeepSpeed cannot convert it to a universal checkpoint: {reason}") from None
