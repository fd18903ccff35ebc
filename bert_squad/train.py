"""The training job: check every input -> build (features, batch plan, engine, resume) -> loop -> finish.

`main` finds everything that can be wrong with the input before it starts the process group or
writes a file. `train` then builds the run, `loop` trains it (reading like nanoGPT's: one block per
concern, each under one condition) and `finish` evaluates, exports and writes the final metrics.
"""

import dataclasses
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from bert_squad import cache, checkpoint, config, distributed, dsconfig, outputs, perf
from bert_squad import data as data_lib
from bert_squad import model as model_lib
from bert_squad.errors import UserError
from bert_squad.features import check_tokenizer
from bert_squad.files import writable_directory, write_json_atomic
from bert_squad.preemption import EXIT_STOPPED, StopRequest


@dataclass
class Inputs:
    """What `main` checked and loaded before anything was started or written."""

    dist: distributed.DistEnv
    ds_config: dict
    train_examples: data_lib.Examples
    dev_examples: Optional[data_lib.Examples]
    tokenizer: Any
    module: Any  # the transformers QA model, before DeepSpeed wraps it
    resume_from: Optional[Path]


@dataclass
class Run:
    """A built run: what the loop and `finish` work on."""

    engine: Any
    plan: Any  # batching.BatchPlan
    rows: Any  # the train features' model columns
    collate: Any
    dev_features: Any
    progress: checkpoint.Progress
    steps_per_epoch: int
    total_steps: int
    meter: perf.Meter
    feature_report: dict
    device_name: str
    started: float  # perf_counter() when the build began: the run's wall time counts from here
    evals: list = dataclasses.field(default_factory=list)
    last_rates: dict = dataclasses.field(default_factory=dict)


def main(argv):
    cfg = config.parse_run_config(argv)
    quiet_libraries(cfg.debug)
    if cfg.data.download_only:
        return download_only(cfg.data)
    inputs = check_inputs(cfg)
    dist = inputs.dist
    with distributed.process_group(dist, cfg.faults.dist_timeout) as device:
        print(f"rank {dist.rank}/{dist.world_size} pid {os.getpid()} local_rank {dist.local_rank} device {device} "
              f"backend {distributed.backend()} launcher {dist.launcher} master {dist.master_addr}:{dist.master_port}",
              flush=True)
        return train(cfg, inputs, device)


def check_inputs(cfg):
    """Everything that can be wrong with the input, found before any process group or file exists."""
    from deepspeed.accelerator import get_accelerator

    model_dir = cache.find_model(cfg.data.model, cfg.data.cache_dir)
    model_lib.go_offline()
    dist = distributed.detect()
    ds_path = dsconfig.locate(cfg.train.deepspeed_config)
    ds_config = dsconfig.resolve(dsconfig.load(ds_path), ds_path, world_size=dist.world_size,
                                 has_gpu=get_accelerator().device_name() != "cpu",
                                 learning_rate=cfg.train.learning_rate)
    dsconfig.place_monitors(ds_config, ds_path, cfg.data.output_dir)
    resume_from = checkpoint.find(cfg.faults.resume, cfg.data.output_dir) if cfg.faults.resume else None
    if resume_from:
        ds_config = checkpoint.adapt(ds_config, resume_from, dist.world_size)
    train_ex, dev_ex = load_examples(cfg.data)
    tokenizer = model_lib.load_tokenizer(model_dir)
    check_tokenizer(tokenizer, train_ex.records[0], cfg.windows)
    import transformers

    transformers.set_seed(cfg.train.seed)  # the new span head starts the same in every run and on every rank
    module = model_lib.load_qa_model(model_dir)
    # Recorded in the exported config: whether "no answer" competes when the model answers (answer.Answerer).
    module.config.version_2_with_negative = train_ex.version_2
    writable_directory(cfg.data.output_dir, "--output-dir ")  # the last check, and the first thing written
    return Inputs(dist, ds_config, train_ex, dev_ex, tokenizer, module, resume_from)


def train(cfg, inputs, device):
    """Build the run, train it, and finish it unless a stop was requested."""
    run = build(cfg, inputs, device)
    show_bar = sys.stdout.isatty() and not distributed.started_by_launcher()
    if loop(run, cfg, inputs, device, show_bar) == EXIT_STOPPED:
        return EXIT_STOPPED
    finish(run, cfg, inputs, device)
    return 0


def build(cfg, inputs, device):
    """Features, batch plan, schedule, DeepSpeed engine, and the resumed position."""
    import deepspeed
    import torch

    from bert_squad.batching import BatchPlan, Collator
    from bert_squad.features import build_features, feature_report

    dist, ds_config, windows = inputs.dist, inputs.ds_config, cfg.windows
    torch.manual_seed(cfg.train.seed + dist.rank)
    t0 = time.perf_counter()
    features = build_features(inputs.train_examples, inputs.tokenizer, windows, cfg.data.cache_dir, True, dist)
    dev_features = (build_features(inputs.dev_examples, inputs.tokenizer, windows, cfg.data.cache_dir, False, dist)
                    if inputs.dev_examples else None)
    report = feature_report(inputs.train_examples, features)
    log(dist, describe_features(inputs.train_examples, report, windows, time.perf_counter() - t0))
    if dev_features is not None:
        log(dist, f"eval {inputs.dev_examples.source}: {len(inputs.dev_examples)} questions, {len(dev_features)} "
                  f"features; {inputs.dev_examples.skip_summary()}")

    micro, gas = ds_config["train_micro_batch_size_per_gpu"], ds_config["gradient_accumulation_steps"]
    plan = BatchPlan([len(x) for x in features["input_ids"]], micro, dist.world_size, dist.rank,
                     cfg.train.seed, group_by_length=not cfg.speed.pad_to_max_length, accumulation=gas)
    steps_per_epoch = len(plan) // gas
    if len(features) < ds_config["train_batch_size"]:
        log(dist, f"note: {len(features)} train features are fewer than one global batch of "
                  f"{ds_config['train_batch_size']}; each step repeats them to fill it")
    total_steps = cfg.train.max_steps or math.ceil(cfg.train.epochs * steps_per_epoch)
    dsconfig.fill_schedule(ds_config, total_steps, cfg.train.warmup_ratio)
    weight_decay = ds_config.get("optimizer", {}).get("params", {}).get("weight_decay", 0.0)
    engine, _, _, _ = deepspeed.initialize(model=inputs.module, config=ds_config,
                                           model_parameters=param_groups(inputs.module, weight_decay))
    if cfg.speed.compile:
        engine.compile()

    progress = resume(engine, inputs)
    columns = [c for c in ("input_ids", "token_type_ids", "attention_mask", "start_positions", "end_positions")
               if c in features.column_names]
    collate = Collator(inputs.tokenizer.pad_token_id, multiple_of=8 if device.type == "cuda" else 1,
                       pad_to=windows.max_seq_length if cfg.speed.pad_to_max_length else None)
    device_name = perf.device_name(device)
    peak = perf.peak_tflops(device_name, dsconfig.precision(ds_config), cfg.speed.peak_tflops)
    log(dist, f"training {total_steps} steps ({steps_per_epoch} per epoch), global batch "
              f"{ds_config['train_batch_size']} = {micro} x {gas} x {dist.world_size}, {dsconfig.precision(ds_config)}, "
              f"zero stage {dsconfig.zero_stage(ds_config)}, device {device_name}")
    meter = perf.Meter(perf.model_shape(engine.module), dist.world_size, peak)  # starts the clock
    return Run(engine, plan, features.select_columns(columns), collate, dev_features, progress,
               steps_per_epoch, total_steps, meter, report, device_name, t0)


def resume(engine, inputs):
    """Where training continues: the checkpoint's position (weights and optimizer loaded), or the start."""
    dist, path = inputs.dist, inputs.resume_from
    if not path:
        return checkpoint.Progress()
    progress = checkpoint.load(engine, path, dist)
    log(dist, f"resumed from {path} at step {progress.step}")
    old_world = checkpoint.written_by(path)[0]
    if old_world not in (None, dist.world_size):
        log(dist, f"note: the checkpoint was written by {old_world} ranks, this run has {dist.world_size}: "
                  f"gradient accumulation {engine.gradient_accumulation_steps()} keeps its global batch of "
                  f"{engine.train_batch_size()}; from here the batches and dropout differ from an uninterrupted run")
    return progress


def optimizer_steps(run, device):
    """The micro batches of each remaining optimizer step, across epochs, from where `run.progress` stands.

    `progress` is advanced as each step is handed out, so a checkpoint taken after the step resumes
    with exactly the next one."""
    from torch.utils.data import DataLoader

    gas = run.engine.gradient_accumulation_steps()
    progress = run.progress
    while progress.step < run.total_steps:
        batches = run.plan.epoch(progress.epoch)[:run.steps_per_epoch * gas]
        loader = iter(DataLoader(run.rows, batch_sampler=batches[progress.batch_in_epoch:], collate_fn=run.collate,
                                 num_workers=0 if device.type == "cpu" else 2, pin_memory=device.type == "cuda"))
        for _ in range(progress.batch_in_epoch // gas, run.steps_per_epoch):
            if progress.step >= run.total_steps:
                return
            micro_batches = [next(loader) for _ in range(gas)]
            progress.step, progress.batch_in_epoch = progress.step + 1, progress.batch_in_epoch + gas
            yield micro_batches
        progress.epoch, progress.batch_in_epoch = progress.epoch + 1, 0


def loop(run, cfg, inputs, device, show_bar):
    """Train to `run.total_steps`; EXIT_STOPPED when a signal asked every rank to stop at a checkpoint."""
    engine, progress, dist, every = run.engine, run.progress, inputs.dist, cfg.train
    stop = StopRequest()
    with ProgressDisplay(run, dist, show_bar) as bar:
        for micro_batches in optimizer_steps(run, device):
            # forward and backward; DeepSpeed applies the optimizer step after the last micro batch
            for batch in micro_batches:
                loss = engine(**{k: v.to(device, non_blocking=True) for k, v in batch.items()}).loss
                engine.backward(loss)
                engine.step()
                run.meter.add(batch, loss)  # counted on the host copy; the loss stays on the device
            # log: the only host sync, every --log-every steps
            if progress.step % every.log_every == 0 or progress.step == run.total_steps:
                run.last_rates = run.meter.log_rates(distributed.all_sum)
                bar.log(format_rates(progress.step, run.total_steps, engine.get_lr()[0], run.last_rates, device))
                engine.monitor.write_events(monitor_events(run.last_rates, engine.global_samples))
            # evaluate mid-run (the last step's evaluation is part of `finish`)
            if every.eval_every and progress.step % every.eval_every == 0 and progress.step < run.total_steps:
                evaluate_now(run, cfg, inputs, device)
            # checkpoint, and stop when any rank was asked to
            if distributed.any_rank(stop.requested):
                checkpoint.save(engine, cfg.data.output_dir, progress, cfg.faults.keep_checkpoints, dist)
                log(dist, f"stop requested (signal {stop.signum or 'on another rank'}): checkpoint at step "
                          f"{progress.step} saved; exiting with {EXIT_STOPPED}, resume with --resume auto")
                return EXIT_STOPPED
            if cfg.faults.checkpoint_every and progress.step % cfg.faults.checkpoint_every == 0:
                checkpoint.save(engine, cfg.data.output_dir, progress, cfg.faults.keep_checkpoints, dist)
            bar.advance(progress.step, run.last_rates)
    return 0


def evaluate_now(run, cfg, inputs, device, output_dir=None):
    """Evaluate the current weights on the dev set (every rank takes part); metrics on rank 0."""
    from bert_squad.evaluate import evaluate

    if run.dev_features is None:
        return None
    metrics = evaluate(run.engine.module, inputs.dev_examples, run.dev_features, device,
                       inputs.tokenizer.pad_token_id, cfg.answers, inputs.dist, output_dir=output_dir)
    run.engine.empty_partition_cache()  # ZeRO-3 keeps the parameters evaluation gathered: give them back
    if metrics is not None:
        run.evals.append(dict(metrics, step=run.progress.step))
        log(inputs.dist, f"eval step {run.progress.step}: {json.dumps(metrics)}")
    return metrics


def finish(run, cfg, inputs, device):
    """Final evaluation, the exported model, and last the metrics file that marks the run finished."""
    dist, out = inputs.dist, Path(cfg.data.output_dir)
    wall = time.perf_counter() - run.started
    run_rates = run.meter.run_rates(distributed.all_sum)
    state = model_lib.gathered_state_dict(run.engine)  # a collective under ZeRO-3
    digests = distributed.gather_to_rank0(None if state is None else weights_checksum(state), dist)
    checksums = [d for d in digests or [] if d]  # under ZeRO-3 only rank 0's
    evaluate_now(run, cfg, inputs, device, output_dir=out)
    if dist.is_main:
        model_lib.export(run.engine.module, state, inputs.tokenizer, out)
        write_json_atomic(out / outputs.TRAIN_METRICS, {
            "steps": run.progress.step, "epochs": run.progress.step / run.steps_per_epoch,
            "world_size": dist.world_size, "train_batch_size": inputs.ds_config["train_batch_size"],
            "precision": dsconfig.precision(inputs.ds_config), "wall_time_s": wall, "device": run.device_name,
            **{f"run_{k}": v for k, v in run_rates.items()}, "last_log": run.last_rates,
            "peak_memory_gib": perf.peak_memory_gib(device), "features": run.feature_report, "evals": run.evals,
            "weights_sha256_per_rank": checksums, "deepspeed_config": inputs.ds_config,
            "config": dataclasses.asdict(cfg)})
        log(dist, f"saved model and tokenizer to {out} ({wall:.0f}s)")


def log(dist, msg):
    if dist.is_main:
        print(msg, flush=True)


class ProgressDisplay:
    """A rich bar where a person watches a single process; plain log lines (rank 0's) everywhere else."""

    def __init__(self, run, dist, show_bar):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.dist, self.enabled = dist, show_bar and dist.is_main
        self.bar = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                            TextColumn("{task.fields[info]}"), disable=not self.enabled)
        self.task = self.bar.add_task("train", total=run.total_steps, completed=run.progress.step, info="")

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)

    def log(self, line):
        if self.enabled:
            self.bar.console.print(line)
        else:
            log(self.dist, line)

    def advance(self, step, rates):
        info = f"loss {rates['loss']:.3f} {rates['samples_per_second']:.1f} samples/s" if rates else ""
        self.bar.update(self.task, completed=step, info=info)


def describe_features(examples, report, windows, seconds):
    return (f"train {examples.source}: {report['examples']} questions ({report['answerable']} answerable), "
            f"{report['features']} features of up to {windows.max_seq_length} tokens (doc stride "
            f"{windows.doc_stride}); {report['answers_in_no_window']} answers fit in no window, "
            f"{report['windows_without_answer']} windows of answerable questions miss the answer (CLS), "
            f"{examples.skip_summary()} [{seconds:.1f}s]")


def format_rates(step, total, lr, rates, device):
    mfu = f" mfu {rates['mfu']:.1%}" if rates["mfu"] is not None else ""
    return (f"step {step}/{total} loss {rates['loss']:.4f} lr {lr:.2e} {rates['samples_per_second']:.1f} "
            f"samples/s {rates['tokens_per_second']:.0f} tok/s {rates['tflops_per_device']:.2f} TFLOP/s/dev{mfu} "
            f"peak mem {perf.peak_memory_gib(device):.1f}GiB")


def monitor_events(rates, samples):
    """The log line's loss and throughput for DeepSpeed's monitors (it writes the learning rate itself), by
    samples seen, as DeepSpeed's own series are."""
    return [(f"Train/Samples/{name}", rates[key], samples) for name, key in
            (("train_loss", "loss"), ("samples_per_second", "samples_per_second"),
             ("tokens_per_second", "tokens_per_second"))]


def param_groups(module, weight_decay):
    """No weight decay on biases and LayerNorm weights, as BERT was trained."""
    decay, no_decay = [], []
    for p in module.parameters():
        (no_decay if p.ndim < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def weights_checksum(state):
    """A digest of this rank's weights: data-parallel ranks that agree end with equal digests (under
    ZeRO-3 only rank 0 holds whole weights, so there is one digest)."""
    import hashlib

    h = hashlib.sha256()
    for _, p in sorted(state.items()):
        h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


def load_examples(data):
    """(train, dev) examples from local files or the cached hub dataset; dev is None with --no-eval."""
    if data.train_file:
        train = data_lib.read_squad(data.train_file, strict=data.strict)
        dev = data_lib.read_squad(data.eval_file, strict=data.strict) if data.eval_file else None
    else:
        train = data_lib.load_hub_split(data.dataset, "train", data.cache_dir)
        dev = (data_lib.read_squad(data.eval_file, strict=data.strict) if data.eval_file
               else data_lib.load_hub_split(data.dataset, "validation", data.cache_dir))
    return train, (None if data.no_eval else dev)


def download_only(data):
    """Login-node step: model, tokenizer and dataset into the cache; one clear line when offline."""
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.utils import RepositoryNotFoundError

    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "10")
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "30")
    try:
        huggingface_hub.model_info(data.model, timeout=10)
    except RepositoryNotFoundError:  # reached, but no such model (a typo, or private)
        raise UserError(f"model '{data.model}' is not on the hub {constants.ENDPOINT} (or not "
                        f"visible without a token): check its name") from None
    except Exception as err:  # any other failure here means: no usable hub from this machine
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UserError(f"cannot reach the Hugging Face hub for model '{data.model}' ({reason}); "
                        f"--download-only needs internet (a login node), compute nodes then run offline") from None
    print(f"model -> {model_lib.download(data.model, data.cache_dir)}")
    if not data.train_file:
        print(f"dataset -> {data_lib.download_dataset(data.dataset, data.cache_dir)}")
    return 0


def quiet_libraries(debug):
    """DeepSpeed logs every step at INFO; batch logs should show our lines and real warnings."""
    import warnings

    import datasets
    import transformers
    from deepspeed.utils import logger as ds_logger

    ds_logger.setLevel(logging.INFO if debug else logging.WARNING)
    # DeepSpeed's warmup schedulers ask themselves for a rate while being built and warn about it, every run.
    ds_logger.addFilter(lambda record: "scheduler before it has started" not in record.getMessage())
    warnings.filterwarnings("ignore", message=".*(all_gather_into_tensor|reduce_scatter_tensor).* is deprecated")
    datasets.utils.logging.set_verbosity_warning()
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_warning()
