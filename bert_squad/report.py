"""What a run shows: rank 0's log lines, and a progress bar where a person watches one process.

Every line a training run prints is worded here, so the training loop only says what happened.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from bert_squad import checkpoint, distributed, perf
from bert_squad.config import PADDINGS

if TYPE_CHECKING:  # types only: importing them here would import torch's companions into every command
    from collections.abc import Mapping
    from pathlib import Path

    import torch

    from bert_squad.best import Best
    from bert_squad.choices import Choice
    from bert_squad.config import WindowConfig
    from bert_squad.data import Examples
    from bert_squad.distributed import DistEnv
    from bert_squad.dsconfig import DeepSpeedConfig


def log(dist: DistEnv, msg: str) -> None:
    """A line from rank 0 only: one log, not one copy per rank."""
    if dist.is_main:
        print(msg, flush=True)


def rank_line(dist: DistEnv, device: torch.device, backend: str) -> str:
    """Every rank's first line: where it is and how it found its peers."""
    return (
        f"rank {dist.rank}/{dist.world_size} pid {os.getpid()} local_rank {dist.local_rank} "
        f"device {device} backend {backend} launcher {dist.launcher} master {dist.master_addr}:{dist.master_port}"
    )


def features_line(examples: Examples, report: Mapping[str, int], windows: WindowConfig, seconds: float) -> str:
    return (
        f"train {examples.source}: {report['examples']} questions ({report['answerable']} answerable), "
        f"{report['features']} features of up to {windows.max_seq_length} tokens (doc stride "
        f"{windows.doc_stride}); {report['answers_in_no_window']} answers fit in no window, "
        f"{report['windows_without_answer']} windows of answerable questions miss the answer (CLS), "
        f"{examples.skip_summary()} [{seconds:.1f}s]"
    )


def eval_features_line(examples: Examples, features: Any) -> str:
    return f"eval {examples.source}: {len(examples)} questions, {len(features)} features; {examples.skip_summary()}"


def plan_line(
    total_steps: int,
    steps_per_epoch: int,
    ds_config: DeepSpeedConfig,
    chosen: tuple[Choice, Choice, str],
    device_name: str,
    engine: Any,
) -> str:
    """The run's plan in one line; `chosen`: the DeepSpeed config and padding the run takes and why
    (`choices`), and what its precision costs where the device emulates it."""
    (config, padding, cost), b, facts = chosen, ds_config.batch, engine_facts(engine)
    wrapper = f" in {facts['optimizer_wrapper']}" if facts["optimizer_wrapper"] else ""
    autocast = f" under {facts['autocast']} autocast" if facts["autocast"] else ""
    clip = f", gradient norm clipped to {ds_config.loop_clip:g} in one foreach call" if ds_config.loop_clip else ""
    padded = f"{PADDINGS[padding.value]}: " + ("--padding given" if padding.why == "given" else padding.why)
    precision = f"{ds_config.precision} ({config.value}{', given' if config.why == 'given' else ': ' + config.why})"
    return (
        f"training {total_steps} steps ({steps_per_epoch} per epoch), global batch {b.size} = {b.micro} x "
        f"{b.accumulation} x {b.world_size} (each micro batch padded to {padded}), {precision}"
        f"{'; ' + cost if cost else ''}, zero stage {ds_config.zero_stage}, "
        f"device {device_name}, optimizer {facts['optimizer']}{wrapper}{autocast}{clip}"
    )


def engine_facts(engine: Any) -> dict[str, Any]:
    """What the DeepSpeed engine built: the optimizer's class (torch's, or one of DeepSpeed's), the wrapper
    DeepSpeed put around it for 16-bit weights or ZeRO (None: it steps the optimizer itself), the autocast
    dtype, and the steps skipped for an fp16 overflow so far. Two runs' speeds compare only where these do."""
    optimizer, wrapper = checkpoint.optimizer_classes(engine)
    autocast = str(engine.torch_autocast_dtype()).replace("torch.", "") if engine.torch_autocast_enabled() else None
    return {
        "optimizer": optimizer,
        "optimizer_wrapper": wrapper,
        "autocast": autocast,
        "skipped_steps": engine.skipped_steps,
    }


def rates_line(step: int, total: int, lr: float, rates: perf.Rates, device: torch.device, skipped: int = 0) -> str:
    """A log step's line; `skipped`: the optimizer steps the loss scaler has skipped so far (said when any)."""
    mfu = f" mfu {rates['mfu']:.1%}" if rates["mfu"] is not None else ""
    skips = f" skipped {skipped} (fp16 overflow)" if skipped else ""
    return (
        f"step {step}/{total} loss {rates['loss']:.4f} lr {lr:.2e}{skips} {rates['samples_per_second']:.1f} "
        f"samples/s {rates['tokens_per_second']:.0f} tok/s {rates['tflops_per_device']:.2f} TFLOP/s/dev{mfu} "
        f"peak mem {perf.peak_memory_gib(device):.1f}GiB"
    )


def eval_line(step: int, metrics: Mapping[str, Any], seconds: float) -> str:
    """An evaluation's metrics, and its time, which the training rates leave out (`perf.Meter.paused`)."""
    return f"eval step {step}: {json.dumps(metrics)} [{seconds:.1f}s]"


def checkpoint_line(step: int, path: Path, seconds: float) -> str:
    """A checkpoint's place, and its time, which the training rates leave out (`perf.Meter.paused`)."""
    return f"checkpoint step {step}: saved {path} [{seconds:.1f}s]"


def early_stop_line(step: int, patience: int, record: Best) -> str:
    return (
        f"early stopping at step {step}: {patience} evaluations without a better dev F1 than step "
        f"{record.step}'s; its model is the one saved"
    )


def saved_line(out: Path, took: str, step: int | None, kept: Best | None) -> str:
    """A finished run's last line: what it saved where. `step`: the step whose model was exported (None: none,
    --no-export); `kept`: the best evaluation's record where --keep-best kept one, so the line names whose model
    it is."""
    if step is None:
        return f"saved the metrics to {out}, no model (--no-export) ({took})"
    if kept is None:
        return f"saved model and tokenizer to {out} ({took})"
    if kept.step == step and kept.metrics is not None:
        whose = f"the best dev F1, {kept.metrics['f1']:.2f}"
    else:
        whose = f"the last step's: the export of the best step {kept.step} is gone (resumed from an older checkpoint?)"
    return f"saved the model of step {step} ({whose}) and its tokenizer to {out} ({took})"


def stopping_line(signum: int) -> str:
    """What a run says when it first sees a stop request (`signum`): a second Ctrl-C is the way out at once."""
    if signum == signal.SIGINT:
        return "Ctrl-C: stopping at the next step every rank checks, with a checkpoint; Ctrl-C again aborts"
    return f"signal {signal.Signals(signum).name}: stopping at the next step every rank checks, with a checkpoint"


def stopped_line(step: int, signum: int | None, code: int) -> str:
    """The last line of a run stopped by a signal (`signum`; None: another rank's), with the resume hint."""
    why = f"signal {signal.Signals(signum).name}" if signum else "signal on another rank"
    return f"stop requested ({why}): checkpoint at step {step} saved; exiting with {code}, resume with --resume auto"


def monitor_events(rates: perf.Rates, samples: int) -> list[tuple[str, float | None, int]]:
    """The log line's loss and throughput for DeepSpeed's monitors (it writes the learning rate itself), by
    samples seen, as DeepSpeed's own series are."""
    return [
        (f"Train/Samples/{name}", rates[key], samples)
        for name, key in (
            ("train_loss", "loss"),
            ("samples_per_second", "samples_per_second"),
            ("tokens_per_second", "tokens_per_second"),
        )
    ]


@dataclass(frozen=True)
class Display:
    """Where rank 0 shows an inference's forward passes (`InferenceProgress`), named `label`: a command's on
    stderr, its stdout being its output; a training's evaluation in the training's log, stdout (`stdout`), and
    as a row of the training's own bar (`within`) where that is live."""

    label: str = "predict"
    stdout: bool = False
    within: Progress | None = None


TRAINING_EVAL = Display("eval", stdout=True)  # a training's evaluation where no training bar is live


class ProgressDisplay:
    """A rich bar where a person watches a single process; plain log lines (rank 0's) everywhere else."""

    def __init__(self, dist: DistEnv, total_steps: int, done_steps: int, isatty: bool) -> None:
        # Under mpirun, PMI or srun a rank's stdout is a pty or pipe nobody watches: no bar there.
        self.dist, self.enabled = dist, isatty and dist.is_main and not distributed.started_by_launcher()
        self.bar = Progress(
            TextColumn("[bold]{task.description}"),  # train, and an evaluation's row (`evaluation`)
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[info]}"),
            disable=not self.enabled,
        )
        self.task = self.bar.add_task("train", total=total_steps, completed=done_steps, info="")

    def __enter__(self) -> ProgressDisplay:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        return self.bar.__exit__(*exc)

    def log(self, line: str) -> None:
        if self.enabled:
            self.bar.console.print(line)
        else:
            log(self.dist, line)

    def advance(self, step: int, rates: perf.Rates | None) -> None:
        info = f"loss {rates['loss']:.3f} {rates['samples_per_second']:.1f} samples/s" if rates else ""
        self.bar.update(self.task, completed=step, info=info)

    def evaluation(self) -> Display:
        """Where an evaluation inside the loop shows its progress: a row of this bar where it is live, else the
        log's lines."""
        return replace(TRAINING_EVAL, within=self.bar if self.enabled else None)


class InferenceProgress:
    """An inference's forward passes, counted where its `Display` says: a rich bar where a person watches (the
    stream a terminal, no launcher; or a row of a training's live bar), else a line at each tenth of the passes
    for a batch log; nothing where not `enabled` (the other ranks)."""

    TENTHS = 10

    def __init__(self, total: int, enabled: bool, display: Display = Display()) -> None:
        self.total, self.done, self.label = total, 0, display.label
        self.stream = sys.stdout if display.stdout else sys.stderr
        joined = display.within if enabled else None
        watched = enabled and (joined is not None or (self.stream.isatty() and not distributed.started_by_launcher()))
        self.own = joined is None
        self.bar = joined or Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=Console(file=self.stream),
            disable=not watched,
        )
        self.lines = enabled and not watched
        self.task = self.bar.add_task(self.label, total=total, info="")

    def __enter__(self) -> InferenceProgress:
        if self.own:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.own:
            return self.bar.__exit__(*exc)
        self.bar.remove_task(self.task)  # the training's bar goes on without the evaluation's row
        return None

    def advance(self) -> None:
        self.done += 1
        self.bar.update(self.task, completed=self.done)
        tenth = self.done * self.TENTHS // self.total
        if self.lines and tenth > (self.done - 1) * self.TENTHS // self.total:
            share = self.done * 100 // self.total
            print(f"{self.label}: {self.done}/{self.total} batches ({share}%)", file=self.stream, flush=True)
