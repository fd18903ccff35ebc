"""The training job, as orchestration only: check -> build -> loop -> finish.

`check` finds everything that can be wrong with the input before a process group starts or a file is
written. `build` makes the run: the features and batch plan, the finished DeepSpeed config (`plan_work`),
the engine and the resumed position. `loop` trains it, reading like nanoGPT's: one block per concern, each
under one condition. `finish` evaluates, exports and writes the final metrics, the file that says the run
finished. `bert-squad config` stops after `plan_work` and prints the configuration instead of training.

The command line imports this module only after its arguments parsed and `runtime.prepare` ran, so the
libraries below load with the process set up, and `--help` loads none of them.
"""

import contextlib
import dataclasses
import json
import math
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import datasets
import deepspeed
import torch
import transformers
from deepspeed.accelerator import get_accelerator
from torch.utils.data import DataLoader
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from bert_squad import (
    best,
    cache,
    checkpoint,
    choices,
    compiling,
    config,
    data,
    distributed,
    dsconfig,
    model,
    outputs,
    perf,
    plots,
    report,
    resume,
    task,
)
from bert_squad.batching import BatchPlan, Collator, feature_lengths
from bert_squad.engine import start as start_engine
from bert_squad.errors import UserError, first_line
from bert_squad.evaluate import predict, score_predictions
from bert_squad.features import build_features, check_tokenizer, feature_report
from bert_squad.files import (
    PathLike,
    directory,
    undone_if_refused,
    writable_directory,
    write_json_atomic,
    write_text_atomic,
)
from bert_squad.history import History
from bert_squad.preemption import EXIT_STOPPED, StopRequest


@dataclass(frozen=True)
class Inputs:
    """What `check` found and loaded before anything was started or written."""

    cfg: config.RunConfig
    dist: distributed.DistEnv
    ds_settings: dsconfig.Settings  # the DeepSpeed config for this world, all but the schedule
    train_examples: data.Examples
    dev_examples: Optional[data.Examples]
    tokenizer: PreTrainedTokenizerFast
    module: PreTrainedModel  # the transformers QA model, before DeepSpeed wraps it
    resuming: Optional[resume.Decision]  # the checkpoint it continues, and how
    stamp: checkpoint.Stamp  # what the run's checkpoints record of it, the task its exports record among it
    chosen: "Chosen"  # the config and padding `cfg` holds, and why


@dataclass(frozen=True)
class Chosen:
    """The DeepSpeed config and padding a run takes, given or chosen by its device (`choices`), with why."""

    deepspeed_config: choices.Choice
    padding: choices.Choice
    timed: bool  # the precision was left to this rank's CPU, which may time bf16 against fp32

    @classmethod
    def of(cls, cfg: config.RunConfig, dist: distributed.DistEnv, resumed: Optional[checkpoint.Resumable]) -> "Chosen":
        """What `cfg` leaves to the device, chosen for this rank's; a resumed checkpoint keeps its precision (one
        whose marker predates the record was written in ds_fp32, every run's default then)."""
        device = distributed.rank_device(dist)
        precision = (resumed.layout.precision or "fp32") if resumed else None
        gpu_bf16 = device.type != "cpu" and get_accelerator().is_bf16_supported()
        named = cfg.train.named_config
        ds = choices.precision(named, device.type, gpu_bf16, choices.this_cpuinfo(), perf.bf16_speedup, precision)
        timed = device.type == "cpu" and not named and resumed is None  # the same on every rank: all or none time
        return cls(ds, choices.padding(cfg.speed.padding, cfg.speed.compile, device.type), timed)

    def reasons(self) -> dict[str, str]:
        """Why the run takes each, as its records give it ("given": the user named it)."""
        return {"deepspeed_config": self.deepspeed_config.why, "padding": self.padding.why}

    def applied(self, cfg: config.RunConfig) -> config.RunConfig:
        """`cfg` with the config and padding it takes: what the run records and acts on."""
        train = dataclasses.replace(cfg.train, deepspeed_config=self.deepspeed_config.value, bf16=False, fp16=False)
        return dataclasses.replace(cfg, train=train, speed=dataclasses.replace(cfg.speed, padding=self.padding.value))


@dataclass(frozen=True)
class Work:
    """The run's work, fixed before the engine starts: features, who trains on which, and for how long."""

    features: datasets.Dataset  # train features, all columns
    dev_features: Optional[datasets.Dataset]
    feature_report: dict
    batches: BatchPlan
    steps_per_epoch: int
    total_steps: int
    ds_config: dsconfig.DeepSpeedConfig  # finished: the schedule follows from total_steps


@dataclass
class Run:
    """A built run: what `loop` and `finish` work on."""

    inputs: Inputs
    work: Work
    device: torch.device
    engine: deepspeed.DeepSpeedEngine
    rows: datasets.Dataset  # the train features' model columns
    collate: Collator
    progress: checkpoint.Progress
    meter: perf.Meter
    started: float  # perf_counter() when the build began: this part's wall time counts from here
    history: History  # every log line and evaluation of the run, and its parts (a resumed run continues it)
    best_so_far: Optional[best.Best] = None  # with --keep-best or --early-stopping

    @property
    def last_rates(self) -> dict:
        return self.history.logs[-1] if self.history.logs else {}

    def reached(self) -> None:
        """The history's current part has reached this step, after this long."""
        self.history.reach(self.progress.step, time.perf_counter() - self.started)

    def save_extras(self, path: Path) -> None:
        """What rank 0 writes into a checkpoint beside DeepSpeed's files: the history so far, and the best step's
        record where --keep-best keeps one."""
        self.reached()
        self.history.save(path)
        if self.best_so_far:
            self.best_so_far.save(path)


def main(cfg: config.RunConfig) -> int:
    inputs = check(cfg)
    if cfg.faults.overwrite_output_dir and inputs.dist.is_main:
        # Before rank 0 joins the process group, so before any rank writes there: the old run's files go.
        outputs.clear(cfg.data.output_dir)
    group = distributed.process_group(inputs.dist, cfg.faults.dist_timeout)
    with undone_if_refused(cfg.data.output_dir) as keep:  # refused by DeepSpeed's engine, it leaves nothing behind
        writable_directory(cfg.data.output_dir, "--output-dir ")  # the last check, and the first thing written
        with group as device, matmul_precision(cfg.speed.tf32):
            print(report.rank_line(inputs.dist, device, distributed.backend()), flush=True)
            run = build(agreed(inputs), device)
            keep()
            if loop(run) == EXIT_STOPPED:
                return EXIT_STOPPED
            finish(run)
    return 0


def agreed(inputs: Inputs) -> Inputs:
    """`inputs` in rank 0's precision where each rank's CPU timed its own (`Chosen.timed`): a timing near 1x, or
    one taken beside busy neighbours, may differ, and ranks in two precisions cannot train together."""
    if not inputs.chosen.timed:
        return inputs
    rank0s = distributed.broadcast_from_rank0(inputs.chosen.deepspeed_config)
    if rank0s.value == inputs.chosen.deepspeed_config.value:  # nearly always: what `check` built stands
        return inputs
    return in_precision(inputs, rank0s)


def in_precision(inputs: Inputs, taken: choices.Choice) -> Inputs:
    """`inputs` as `check` would have built them had this rank chosen the DeepSpeed config `taken`: its settings
    and the checkpoint stamp that records them."""
    chosen = dataclasses.replace(inputs.chosen, deepspeed_config=taken)
    cfg = chosen.applied(inputs.cfg)
    settings = deepspeed_settings(cfg, inputs.dist, planning=False)
    stamp = checkpoint.stamp(cfg.data.model, inputs.module, inputs.tokenizer, inputs.stamp.task, settings)
    return dataclasses.replace(inputs, cfg=cfg, ds_settings=settings, stamp=stamp, chosen=chosen)


@contextlib.contextmanager
def matmul_precision(tf32: bool) -> Iterator[None]:
    """With `tf32`, torch's "high" float32 matmul precision (TF32 tensor cores where the device has them) for the
    run, and the process's own precision again after it."""
    before = torch.get_float32_matmul_precision()
    if tf32:
        torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def check(cfg: config.RunConfig, planning: bool = False) -> Inputs:
    """Everything that can be wrong with the input, found before any process group or file exists (`planning`:
    for `bert-squad config`, see `deepspeed_settings`)."""
    directory(cfg.data.output_dir, "--output-dir ")
    cfg.faults.check_output_dir(cfg.data.output_dir)
    model_dir = cache.find_model(cfg.data.model, cfg.data.cache_dir)
    dist = distributed.detect()
    resume_from = checkpoint.find(cfg.faults.resume, cfg.data.output_dir) if cfg.faults.resume else None
    chosen = Chosen.of(cfg, dist, resume_from)
    cfg = chosen.applied(cfg)
    settings = deepspeed_settings(cfg, dist, planning)
    why = compiling.unsupported(distributed.rank_device(dist).type) if cfg.speed.compile else None
    if why:
        raise UserError(f"--compile: {why}")
    resuming = resume.decide(resume_from, settings) if resume_from else None
    settings = resuming.settings if resuming else settings
    train_examples, dev_examples = data.load_examples(cfg.data)
    if cfg.train.keeps_best and dev_examples is None:
        raise UserError(
            "--keep-best and --early-stopping choose by dev F1: give an eval set (--eval-file or a hub "
            "--dataset) and drop --no-eval"
        )
    if cfg.train.keeps_best and cfg.data.no_export:
        raise UserError("--keep-best and --early-stopping keep the best step's model: drop --no-export")
    tokenizer = model.load_tokenizer(model_dir)
    check_tokenizer(tokenizer, train_examples.records[0], cfg.windows)
    transformers.set_seed(cfg.train.seed)  # the new span head starts the same in every run and on every rank
    module = model.load_qa_model(
        model_dir, lambda line: report.log(dist, line), cfg.train.dropout, cfg.train.attention_dropout
    )
    model.check_window(module, cfg.windows.max_seq_length, model_dir)
    memory = get_accelerator().total_memory()
    batch_from = "--micro-batch-size" if cfg.train.micro_batch_size else str(settings.path)
    model.check_micro_batch(module, settings.batch.micro, cfg.windows.max_seq_length, memory, batch_from)
    # What its exports record, for the commands that load them: the windows, answer rules and v2.0 mode.
    trained = task.Task(cfg.windows, cfg.postprocess, train_examples.version_2)
    stamp = checkpoint.stamp(cfg.data.model, module, tokenizer, trained, settings)
    if resume_from:
        checkpoint.check_matches(resume_from, stamp)
        for line in resume_from.skipped:  # newer checkpoints passed over as damaged
            report.log(dist, line)
    return Inputs(cfg, dist, settings, train_examples, dev_examples, tokenizer, module, resuming, stamp, chosen)


def deepspeed_settings(cfg: config.RunConfig, dist: distributed.DistEnv, planning: bool) -> dsconfig.Settings:
    """The run's DeepSpeed config (`cfg` as `Chosen.applied` made it) checked for its world on this rank's device;
    a plan (`planning`) on a machine without a GPU leaves what needs the job's device to the job
    (`Settings.needs`)."""
    assert cfg.train.deepspeed_config is not None  # chosen
    path, device = dsconfig.locate(cfg.train.deepspeed_config), distributed.rank_device(dist)
    return dsconfig.settings(
        dsconfig.read(path),
        path,
        world_size=dist.world_size,
        device=None if planning and device.type == "cpu" else device,
        learning_rate=cfg.train.learning_rate,
        micro_batch_size=cfg.train.micro_batch_size,
        gradient_accumulation_steps=cfg.train.gradient_accumulation_steps,
        monitors=cfg.train.monitors,
        output_dir=cfg.data.output_dir,
    )


def plan_work(inputs: Inputs) -> Work:
    """Features (tokenized once, cached), the batch plan and the finished DeepSpeed config."""
    cfg, dist, windows = inputs.cfg, inputs.dist, inputs.cfg.windows
    t0 = time.perf_counter()
    workers = cfg.preprocess.preprocessing_workers
    features = build_features(
        inputs.train_examples, inputs.tokenizer, windows, cfg.data.cache_dir, train=True, dist=dist, workers=workers
    )
    dev_features = (
        build_features(
            inputs.dev_examples, inputs.tokenizer, windows, cfg.data.cache_dir, train=False, dist=dist, workers=workers
        )
        if inputs.dev_examples
        else None
    )
    counts = feature_report(inputs.train_examples, features)
    report.log(dist, report.features_line(inputs.train_examples, counts, windows, time.perf_counter() - t0))
    if inputs.dev_examples is not None and dev_features is not None:
        report.log(dist, report.eval_features_line(inputs.dev_examples, dev_features))
    batch = inputs.ds_settings.batch
    batches = BatchPlan(
        feature_lengths(features),
        batch.micro,
        dist.world_size,
        dist.rank,
        cfg.train.seed,
        group_by_length=inputs.chosen.padding.value != "max-length",
        accumulation=batch.accumulation,
    )
    if len(features) < batch.size:
        report.log(
            dist,
            f"note: {len(features)} train features are fewer than one global batch of {batch.size}; "
            f"each step repeats them to fill it",
        )
    steps_per_epoch = len(batches) // batch.accumulation
    total_steps = cfg.train.max_steps or math.ceil(cfg.train.epochs * steps_per_epoch)
    ds_config = inputs.ds_settings.finish(total_steps, cfg.train.warmup_ratio)
    return Work(features, dev_features, counts, batches, steps_per_epoch, total_steps, ds_config)


def build(inputs: Inputs, device: torch.device) -> Run:
    """The planned run on its engine, at the step it resumes from."""
    cfg, dist = inputs.cfg, inputs.dist
    torch.manual_seed(cfg.train.seed + dist.rank)
    started = time.perf_counter()
    work = plan_work(inputs)
    groups = model.param_groups(inputs.module, work.ds_config.weight_decay)
    inputs.module.train()  # from_pretrained leaves a model in eval mode: dropout on, as the model was pretrained
    engine = start_engine(inputs.module, work.ds_config, groups, device)
    if dist.is_main:  # the run's config, beside its metrics: given back as --deepspeed-config, the same run
        write_text_atomic(Path(cfg.data.output_dir) / outputs.DEEPSPEED_CONFIG, work.ds_config.text() + "\n")
    if dist.world_size == 1 and work.ds_config.zero_stage == 0:
        # One rank has no gradient to average: DeepSpeed would still copy every one into a bucket and back.
        engine.enable_backward_allreduce = False
    if cfg.speed.compile:
        compiling.compile_model(engine.module, device.type)
    progress = resume.load(engine, inputs.resuming, dist) if inputs.resuming else checkpoint.Progress()
    padding = inputs.chosen.padding.value
    collate = Collator.for_training(inputs.tokenizer.pad_token_id, cfg.windows.max_seq_length, padding)
    device_name = perf.device_name(device)
    tf32 = cfg.speed.tf32 and work.ds_config.precision == "fp32"
    peak = perf.peak_tflops(device_name, "tf32" if tf32 else work.ds_config.precision, cfg.speed.peak_tflops)
    cost = choices.cost(work.ds_config.precision, device.type, choices.this_cpuinfo())
    chosen = (inputs.chosen.deepspeed_config, inputs.chosen.padding, cost)
    plan = report.plan_line(work.total_steps, work.steps_per_epoch, work.ds_config, chosen, device_name, engine)
    report.log(dist, plan)
    meter = perf.Meter(perf.model_shape(engine.module), dist.world_size, peak)  # starts the clock
    record = best.Best.load(inputs.resuming.found.path) if inputs.resuming else best.Best()
    finished = Path(cfg.data.output_dir) / outputs.TRAIN_METRICS
    history = History.resumed(inputs.resuming.found.path, finished) if inputs.resuming else History()
    history.start_part(progress.step, dist.world_size)
    return Run(
        inputs,
        work,
        device,
        engine,
        work.features.select_columns(collate.columns(work.features)),
        collate,
        progress,
        meter,
        started,
        history,
        best_so_far=record if cfg.train.keeps_best else None,
    )


def optimizer_steps(run: Run) -> Iterator[list[dict[str, torch.Tensor]]]:
    """The micro batches of each remaining optimizer step, across epochs, from where `run.progress` stands.

    One DataLoader serves every remaining step, epoch boundaries included (its workers start once).
    `progress` is advanced as each step is handed out, so a checkpoint taken after the step resumes
    with exactly the next one."""
    gas, work, progress = run.engine.gradient_accumulation_steps(), run.work, run.progress
    per_epoch, on_gpu = work.steps_per_epoch * gas, run.device.type == "cuda"
    batches = work.batches.stream(
        progress.epoch, progress.batch_in_epoch, per_epoch, (work.total_steps - progress.step) * gas
    )
    # Its own generator: starting the loader draws its workers' base seed, which from torch's global generator
    # would shift the dropout masks of a resumed run (restored to the checkpoint's state) by one draw.
    loader = iter(
        DataLoader(
            run.rows,
            batch_sampler=batches,
            collate_fn=run.collate,
            num_workers=2 if on_gpu else 0,
            pin_memory=on_gpu,
            worker_init_fn=ignore_interrupts,
            generator=torch.Generator().manual_seed(run.inputs.cfg.train.seed),
        )
    )
    while progress.step < work.total_steps:
        if progress.batch_in_epoch >= per_epoch:  # an epoch ended (or a checkpoint was taken at its end)
            progress.epoch, progress.batch_in_epoch = progress.epoch + 1, 0
        micro_batches = [next(loader) for _ in range(gas)]
        progress.step, progress.batch_in_epoch = progress.step + 1, progress.batch_in_epoch + gas
        yield micro_batches


def ignore_interrupts(worker_id: int) -> None:
    """A loader worker leaves Ctrl-C to the rank that started it (`StopRequest`): the terminal sends it to the
    whole process group, and a worker that died of it would end the step before the checkpoint."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def loop(run: Run) -> int:
    """Train to the planned step; EXIT_STOPPED when a signal asked every rank to stop at a checkpoint.

    The host waits for the device only at the log and stop-check steps, and under fp16 where the loop reads
    whether the loss scaler found an overflow (`unscale_and_clip`). Clipping stays on the device
    (docs/performance.md: the step's cost)."""
    engine, progress, total, device = run.engine, run.progress, run.work.total_steps, run.device
    train, faults, dist = run.inputs.cfg.train, run.inputs.cfg.faults, run.inputs.dist
    clip, params = run.work.ds_config.loop_clip, list(engine.module.parameters())
    scaler = engine.torch_autocast_z0_gradscaler  # fp16 autocast at ZeRO stage 0: torch's loss scaler
    stop_check = distributed.StopCheck(progress.step)
    with StopRequest() as stop, report.ProgressDisplay(dist, total, progress.step, sys.stdout.isatty()) as shown:
        for micro_batches in optimizer_steps(run):
            # forward and backward; DeepSpeed applies the optimizer step after the last micro batch
            for batch in micro_batches:
                loss = engine(**{k: v.to(device, non_blocking=True) for k, v in batch.items()}).loss
                engine.backward(loss)
                if (clip or scaler) and engine.is_gradient_accumulation_boundary():  # the step's averaged gradients
                    unscale_and_clip(engine, params, clip)
                engine.step()
                run.meter.add(batch, loss)  # counted on the host copy; the loss stays on the device
            # log every --log-every steps: a host sync (the sums' all-reduce reads the loss off the device)
            logged = progress.step % train.log_every == 0 or progress.step == total
            if logged:
                run.history.logs.append(dict(step=progress.step, **run.meter.log_rates(distributed.all_sum)))
                lr, skipped = engine.get_lr()[0], engine.skipped_steps
                shown.log(report.rates_line(progress.step, total, lr, run.last_rates, device, skipped))
                engine.monitor.write_events(report.monitor_events(run.last_rates, engine.global_samples))
            # evaluate mid-run (the last step's evaluation is part of `finish`); --early-stopping ends the run here
            # (their time is neither step's: each says its own, and the training rates leave it out)
            if train.eval_every and progress.step % train.eval_every == 0 and progress.step < total:
                with run.meter.paused():
                    evaluate_now(run, display=shown.evaluation())
                if run.best_so_far and run.best_so_far.exhausted(train.early_stopping):
                    report.log(dist, report.early_stop_line(progress.step, train.early_stopping, run.best_so_far))
                    break
            if (signum := stop.first_seen()) is not None:  # the handler only records a signal (no I/O there)
                shown.log(report.stopping_line(signum))
            # stop check: ranks look at the log steps and about every 10 s between, the same steps on every rank
            # (StopCheck), so a signal stops all at one step with no collective after every step
            stopping = stop_check.stopping(progress.step, stop.requested, look=logged)
            # checkpoint every --checkpoint-every steps, and at the step where the ranks agreed to stop
            if stopping or (faults.checkpoint_every and progress.step % faults.checkpoint_every == 0):
                with run.meter.paused():
                    save_checkpoint(run)
            if stopping:
                report.log(dist, report.stopped_line(progress.step, stop.signum, EXIT_STOPPED))
                return EXIT_STOPPED
            shown.advance(progress.step, run.last_rates)
    return 0


def unscale_and_clip(engine: deepspeed.DeepSpeedEngine, params: list[torch.nn.Parameter], max_norm: float) -> None:
    """The step's gradients made ready for DeepSpeed's optimizer step, on the device.

    Under fp16 autocast torch's loss scaler unscales them first, and the gradients' norm says whether any
    overflowed (inf or nan in one makes the norm so, as the scaler's own check finds): a host read, fp16's only
    one, since DeepSpeed must know before its step whether to count it. DeepSpeed reads `optimizer.overflow` after
    its step, as its 16-bit wrappers set it: the step then counts as skipped and the LR scheduler stays where it
    is, as HF's Trainer leaves it; torch's AdamW has no such attribute, so without it the skip went uncounted. The
    gradient norm is clipped to `max_norm` (0: not) in the same foreach call."""
    scaler = engine.torch_autocast_z0_gradscaler
    if scaler:
        scaler.unscale_(engine.optimizer)
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm or math.inf, foreach=True)  # inf: scales by 1
        engine.optimizer.overflow = not bool(torch.isfinite(norm))
    elif max_norm:
        torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)


def save_checkpoint(run: Run) -> None:
    """A checkpoint of this step, with the best step's record beside it when --keep-best keeps one."""
    cfg, t0 = run.inputs.cfg, time.perf_counter()
    path = checkpoint.save(
        run.engine,
        cfg.data.output_dir,
        run.progress,
        cfg.faults.keep_checkpoints,
        run.inputs.dist,
        run.inputs.stamp,
        extra=run.save_extras,
    )
    report.log(run.inputs.dist, report.checkpoint_line(run.progress.step, path, time.perf_counter() - t0))


def evaluate_now(
    run: Run, output_dir: Optional[PathLike] = None, display: report.Display = report.TRAINING_EVAL
) -> Optional[dict[str, Any]]:
    """Evaluate the current weights on the dev set (every rank takes part); metrics on rank 0. With a best
    to keep, the predictions go beside the export of each new best instead of into `output_dir`. Its progress
    shows as `evaluate`'s does, where `display` says."""
    inputs, t0 = run.inputs, time.perf_counter()
    if run.work.dev_features is None or inputs.dev_examples is None:  # both or neither
        return None
    if run.best_so_far and inputs.dist.is_main:
        output_dir = best.start_pending(inputs.cfg.data.output_dir)
    postprocess, pad_id = inputs.cfg.postprocess, inputs.tokenizer.pad_token_id
    features, autocast = run.work.dev_features, eval_autocast(run.engine, run.device)
    with torch.compiler.set_stance("force_eager"):  # --compile's graphs are training's (bert_squad/compiling.py)
        result = predict(
            run.engine.module,
            inputs.dev_examples,
            features,
            run.device,
            pad_id,
            postprocess,
            inputs.dist,
            autocast,
            display,
            inputs.cfg.speed.per_device_eval_batch_size,
        )
    metrics = score_predictions(result, inputs.dev_examples, postprocess.lang, output_dir=output_dir)
    run.engine.empty_partition_cache()  # ZeRO-3 keeps the parameters evaluation gathered: give them back
    if metrics is not None:
        run.history.evals.append(dict(metrics, step=run.progress.step))
        report.log(inputs.dist, report.eval_line(run.progress.step, metrics, time.perf_counter() - t0))
    if run.best_so_far and run.best_so_far.judge(run.progress.step, metrics):
        export_best(run)
    return metrics


def eval_autocast(engine: deepspeed.DeepSpeedEngine, device: torch.device) -> Optional[torch.dtype]:
    """The dtype a run's evaluation computes in under autocast: the training's autocast dtype on a GPU, so an
    evaluation costs what the training's forward does (16-bit weights compute in theirs without it). A CPU
    evaluates in fp32: bf16 autocast is not measured faster there, and most CPUs emulate bf16."""
    return engine.torch_autocast_dtype() if engine.torch_autocast_enabled() and device.type == "cuda" else None


def export_best(run: Run) -> None:
    """The model of a new best evaluation, beside its predictions in its own export (every rank takes part)."""
    out, step = run.inputs.cfg.data.output_dir, run.progress.step
    state = model.gathered_state_dict(run.engine)  # a collective under ZeRO-3
    run.engine.empty_partition_cache()
    if run.inputs.dist.is_main:
        assert state is not None and run.best_so_far is not None  # rank 0 holds the whole model; --keep-best
        model.export(run.engine.module, state, run.inputs.tokenizer, run.inputs.stamp.task, best.pending_dir(out))
        best.promote(out, step)
        best.prune(out, run.best_so_far)


def finish(run: Run) -> None:
    """Final evaluation, the exported model (unless --no-export), the metrics file that marks the run finished,
    and last its figure (a figure that fails costs the figure, never the metrics)."""
    inputs = run.inputs
    dist, out, exporting = inputs.dist, Path(inputs.cfg.data.output_dir), not inputs.cfg.data.no_export
    run.reached()
    run_rates = run.meter.run_rates(distributed.all_sum)
    state = model.gathered_state_dict(run.engine) if exporting else None  # a collective under ZeRO-3
    digest = None if state is None else model.weights_digest(state)
    digests = (distributed.gather_to_rank0(digest, dist) or []) if exporting else []
    kept = run.best_so_far
    if not (kept and kept.last_evaluated == run.progress.step):  # an early stop has evaluated this step already
        evaluate_now(run, output_dir=out)
    if not dist.is_main:
        return
    installed = bool(exporting and kept and kept.step is not None and best.install(out, kept.step))
    if exporting and not installed:
        assert state is not None  # rank 0 holds the whole model
        model.export(run.engine.module, state, inputs.tokenizer, inputs.stamp.task, out)
    write_json_atomic(out / outputs.TRAIN_METRICS, train_metrics(run, run_rates, digests))
    draw_curves(run.history, out / outputs.TRAINING_CURVES, dist)
    step = (kept.step if kept and installed else run.progress.step) if exporting else None
    report.log(dist, report.saved_line(out, run.history.took(), step, kept))


def draw_curves(history: History, path: Path, dist: distributed.DistEnv) -> None:
    """training_curves.png, where matplotlib is installed and the figure can be written (else one log line: the
    run has finished, and its metrics are written)."""
    try:
        plots.training_curves(history, path)
    except ImportError:
        report.log(dist, f"note: {plots.MISSING.format(path.name)}")
    except (OSError, UserError, ValueError) as err:
        report.log(dist, f"note: {path} was not drawn ({first_line(err)}); the metrics are written")


def train_metrics(run: Run, run_rates: dict[str, Any], digests: list[Any]) -> dict[str, Any]:
    """What train_metrics.json records of a finished run: its shape, rates, history (every part's) and
    settings."""
    work, kept = run.work, run.best_so_far
    return {
        "steps": run.progress.step,
        "epochs": run.progress.step / work.steps_per_epoch,
        "world_size": run.inputs.dist.world_size,
        "train_batch_size": work.ds_config.batch.size,
        "precision": work.ds_config.precision,
        "engine": report.engine_facts(run.engine),
        "wall_time_s": run.history.wall_time_s,  # every part's, added up
        "device": perf.device_name(run.device),
        **{f"run_{k}": v for k, v in run_rates.items()},
        "last_log": run.last_rates,
        **run.history.as_dict(),  # logs, evals, parts
        "peak_memory_gib": perf.peak_memory_gib(run.device),
        "features": work.feature_report,
        "weights_sha256_per_rank": [d for d in digests if d],  # under ZeRO-3 only rank 0's; none with --no-export
        "deepspeed_config": work.ds_config.as_dict(),
        "config": dataclasses.asdict(run.inputs.cfg),  # with the DeepSpeed config and padding chosen
        "chosen": run.inputs.chosen.reasons(),
        "shapes": sorted(run.meter.shapes),  # this rank's micro batches, (rows, tokens)
        "compile": compiling.stats() if run.inputs.cfg.speed.compile else None,
        **({"best_step": kept.step, "best_metrics": kept.metrics} if kept else {}),
    }


def print_config(cfg: config.RunConfig) -> int:
    """`bert-squad config`: the run's resolved configuration and the DeepSpeed config it would hand the engine
    in this world (features are tokenized into the cache to count the steps), as JSON on stdout (what planning
    says goes to stderr); nothing is trained. Planned where the job will not run (a login node without a GPU,
    or before the model is downloaded), it prints what resolves there and what the job needs (`needs`): a GPU,
    the model's files, its length for the scheduler's "auto" values; the job checks those at its start. Under a
    launcher, rank 0 alone plans and prints: one plan, not one a rank."""
    if not distributed.detect().is_main:
        return 0
    with contextlib.redirect_stdout(sys.stderr):
        try:
            inputs = check(cfg, planning=True)
        except cache.NotCached as missing:  # the run's choices as `check` makes them, before it looked for the model
            dist = distributed.detect()
            resume_from = checkpoint.find(cfg.faults.resume, cfg.data.output_dir) if cfg.faults.resume else None
            chosen = Chosen.of(cfg, dist, resume_from)
            cfg = chosen.applied(cfg)
            settings, work, needs = deepspeed_settings(cfg, dist, planning=True), None, [str(missing)]
            ds_config = settings.finish(None, cfg.train.warmup_ratio)
        else:
            cfg, chosen, settings, work, needs = inputs.cfg, inputs.chosen, inputs.ds_settings, plan_work(inputs), []
            ds_config = work.ds_config
    if ds_config.left_auto():
        needs.append(
            f"the run's length, counted from its features by the model's tokenizer: {', '.join(ds_config.left_auto())} "
            f'stay "auto" here, filled at the job\'s start'
        )
    plan = {
        "run": dataclasses.asdict(cfg),
        "chosen": chosen.reasons(),
        "world_size": settings.batch.world_size,
        "train_features": work and len(work.features),
        "steps_per_epoch": work and work.steps_per_epoch,
        "total_steps": work and work.total_steps,
        "deepspeed_config": ds_config.as_dict(),
        "needs": [*settings.needs, *needs],
    }
    print(json.dumps(plan, indent=2))
    return 0
