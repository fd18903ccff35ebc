"""The training job: data -> features -> DeepSpeed engine -> loop -> evaluation -> export.

Read top to bottom: `main` checks everything that can be wrong with the input before it starts the
process group or writes a file, then `train` runs the loop.
"""

import json
import logging
import math
import os
import sys
import time
from pathlib import Path

from bert_squad import checkpoint, config, distributed, perf
from bert_squad import data as data_lib
from bert_squad import model as model_lib
from bert_squad.errors import UserError
from bert_squad.files import write_json_atomic


def log(msg):
    if distributed.rank() == 0:
        print(msg, flush=True)


def quiet_libraries(debug):
    """DeepSpeed logs every step at INFO; batch logs should show our lines and real warnings."""
    from deepspeed.utils import logger as ds_logger

    ds_logger.setLevel(logging.INFO if debug else logging.WARNING)
    import warnings

    import datasets
    import transformers

    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.* is deprecated")
    datasets.utils.logging.set_verbosity_warning()
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_warning()


def check_output_dir(path):
    """Fail before training, not after hours of it, when the output dir cannot be written."""
    probe = Path(path) / f".write-test-{os.getpid()}"
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise UserError(f"{path}: output dir cannot be written ({err.strerror})") from None


def download_only(args, cache_dir):
    """Login-node step: model, tokenizer and dataset into the cache; one clear line when offline."""
    import huggingface_hub

    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "10")
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "30")
    try:
        huggingface_hub.model_info(args.model, timeout=10)
    except Exception as err:  # any failure here means: no usable hub from this machine
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UserError(f"cannot reach the Hugging Face hub for model '{args.model}' ({reason}); "
                        f"--download-only needs internet (a login node), compute nodes then run offline") from None
    print(f"model -> {model_lib.download(args.model, cache_dir)}")
    if not args.train_file:
        print(f"dataset -> {data_lib.download_dataset(args.dataset, cache_dir)}")
    return 0


def load_examples(args, cache_dir):
    if args.train_file:
        train = data_lib.read_squad(args.train_file, strict=args.strict)
        dev = data_lib.read_squad(args.eval_file, strict=args.strict) if args.eval_file else None
    else:
        train = data_lib.load_hub_split(args.dataset, "train", cache_dir)
        dev = (data_lib.read_squad(args.eval_file, strict=args.strict) if args.eval_file
               else data_lib.load_hub_split(args.dataset, "validation", cache_dir))
    return train, (None if args.no_eval else dev)


def main(argv):
    args = config.parse_args(argv)
    cache_dir = args.cache_dir or model_lib.default_cache_dir()
    quiet_libraries(args.debug)
    if args.download_only:
        return download_only(args, cache_dir)
    # Everything that can be wrong with the input is found here, before any process group or file.
    model_dir = model_lib.resolve(args.model, cache_dir)
    model_lib.go_offline()
    dist = distributed.detect()
    from deepspeed.accelerator import get_accelerator

    ds_path = args.deepspeed_config
    ds_config = config.resolve_ds_config(config.load_ds_config(ds_path), ds_path, world_size=dist.world_size,
                                         has_gpu=get_accelerator().device_name() != "cpu",
                                         learning_rate=args.learning_rate)
    train_ex, dev_ex = load_examples(args, cache_dir)
    tokenizer = model_lib.load_tokenizer(model_dir)
    import transformers

    transformers.set_seed(args.seed)  # the new span head starts the same in every run and on every rank
    module = model_lib.load_qa_model(model_dir)
    check_output_dir(args.output_dir)  # the last check, and the first thing written
    # A bar only where a person watches: MPI launchers hand ranks a pty even in batch jobs.
    show_bar = sys.stdout.isatty() and dist.launcher in ("single", "env")
    with distributed.process_group(dist, args.dist_timeout) as device:
        print(f"rank {dist.rank}/{dist.world_size} pid {os.getpid()} local_rank {dist.local_rank} device {device} "
              f"backend {distributed.backend()} launcher {dist.launcher} master {dist.master_addr}:{dist.master_port}",
              flush=True)
        return train(args, ds_config, module, tokenizer, train_ex, dev_ex, device, cache_dir, show_bar)


def param_groups(module, weight_decay):
    """No weight decay on biases and LayerNorm weights, as BERT was trained."""
    decay, no_decay = [], []
    for p in module.parameters():
        (no_decay if p.ndim < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def train(args, ds_config, module, tokenizer, train_ex, dev_ex, device, cache_dir, show_bar=False):
    import deepspeed
    import torch
    from torch.utils.data import DataLoader

    from bert_squad.batching import BatchPlan, Collator
    from bert_squad.evaluate import evaluate
    from bert_squad.features import WindowConfig, build_features, feature_report

    rank, world = distributed.rank(), distributed.world_size()
    torch.manual_seed(args.seed + rank)
    win = WindowConfig(args.max_seq_length, args.doc_stride, args.max_query_length)
    t_start = time.perf_counter()
    features = build_features(train_ex, tokenizer, win, cache_dir, train=True)
    dev_features = build_features(dev_ex, tokenizer, win, cache_dir, train=False) if dev_ex else None
    report = feature_report(train_ex, features)
    log(f"train {train_ex.source}: {report['examples']} questions ({report['answerable']} answerable), "
        f"{report['features']} features; {report['answers_in_no_window']} answers fit in no window, "
        f"{report['windows_without_answer']} windows of answerable questions miss the answer (CLS), "
        f"{report['skipped_bad_offsets']} questions skipped (answer_start off its text) "
        f"[{time.perf_counter() - t_start:.1f}s]")

    micro, gas = ds_config["train_micro_batch_size_per_gpu"], ds_config["gradient_accumulation_steps"]
    plan = BatchPlan([len(x) for x in features["input_ids"]], micro, world, rank,
                     args.seed, group_by_length=not args.pad_to_max_length)
    steps_per_epoch = len(plan) // gas
    if steps_per_epoch == 0:
        raise UserError(f"{train_ex.source}: {len(features)} features make no full step of "
                        f"{ds_config['train_batch_size']} samples")
    total_steps = args.max_steps or math.ceil(args.epochs * steps_per_epoch)
    config.fill_schedule(ds_config, total_steps, args.warmup_ratio)
    weight_decay = ds_config.get("optimizer", {}).get("params", {}).get("weight_decay", 0.0)
    engine, _, _, _ = deepspeed.initialize(model=module, model_parameters=param_groups(module, weight_decay),
                                           config=ds_config)
    if args.compile:
        engine.compile()

    progress = checkpoint.Progress()
    resume_from = checkpoint.find(args.resume, args.output_dir) if args.resume else None
    if resume_from:
        progress = checkpoint.load(engine, resume_from)
        log(f"resumed from {resume_from} at step {progress.step}")
    stop = checkpoint.StopRequest()

    columns = ["input_ids", "token_type_ids", "attention_mask", "start_positions", "end_positions"]
    collate = Collator(tokenizer.pad_token_id, pad_to=args.max_seq_length if args.pad_to_max_length else None,
                       multiple_of=8 if device.type == "cuda" else 1)
    train_rows = features.select_columns([c for c in columns if c in features.column_names])
    shape = perf.model_shape(engine.module.config)
    dev_name = perf.device_name(device)
    meter = perf.Meter(shape, world, perf.peak_tflops(dev_name, config.precision(ds_config), args.peak_tflops))
    run_meter = perf.Meter(shape, world, meter.peak)
    evals, last_rates, loss_sum, loss_n = [], {}, torch.zeros((), device=device), 0
    log(f"training {total_steps} steps ({steps_per_epoch} per epoch), global batch {ds_config['train_batch_size']} "
        f"= {micro} x {gas} x {world}, {config.precision(ds_config)}, zero stage "
        f"{ds_config.get('zero_optimization', {}).get('stage', 0)}, device {dev_name}")

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                   TextColumn("{task.fields[info]}"), disable=rank != 0 or not show_bar)
    task = bar.add_task("train", total=total_steps, completed=progress.step, info="")
    stopped = False
    with bar:
        while progress.step < total_steps and not stopped:
            batches = plan.epoch(progress.epoch)[:steps_per_epoch * gas]
            loader = DataLoader(train_rows, batch_sampler=batches[progress.batch_in_epoch:], collate_fn=collate,
                                num_workers=0 if device.type == "cpu" else 2, pin_memory=device.type == "cuda")
            for batch in loader:
                meter.add(batch)  # counted on the host copy: no device sync
                run_meter.add(batch)
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
                loss = engine(**batch).loss
                engine.backward(loss)
                boundary = engine.is_gradient_accumulation_boundary()
                engine.step()
                loss_sum, loss_n = loss_sum + loss.detach().float(), loss_n + 1  # no sync per step
                progress.batch_in_epoch += 1
                if not boundary:
                    continue
                progress.step += 1
                if progress.step % args.log_every == 0 or progress.step == total_steps:
                    total_loss, total_n = distributed.all_sum([loss_sum.item(), loss_n])
                    last_rates = meter.rates(distributed.all_sum)
                    line = format_rates(progress.step, total_steps, total_loss / total_n,
                                        engine.get_lr()[0], last_rates, device)
                    bar.console.print(line) if bar.live.is_started else log(line)
                    meter.reset()
                    loss_sum, loss_n = torch.zeros((), device=device), 0
                bar.update(task, completed=progress.step, info=f"loss {loss.item():.3f} lr {engine.get_lr()[0]:.2e} "
                           f"{last_rates.get('samples_per_second', 0):.1f} samples/s" if bar.live.is_started else "")
                if (args.eval_every and progress.step % args.eval_every == 0 and progress.step < total_steps
                        and dev_features is not None):  # the last step's evaluation follows the loop
                    metrics = evaluate(engine.module, dev_ex, dev_features, device, tokenizer, args)
                    if metrics is not None:
                        evals.append(dict(metrics, step=progress.step))
                        log(f"eval step {progress.step}: {json.dumps(metrics)}")
                if distributed.any_rank(stop.requested):
                    checkpoint.save(engine, args.output_dir, progress, args.keep_checkpoints)
                    log(f"stop requested (signal {stop.signum or 'on another rank'}): checkpoint at step "
                        f"{progress.step} saved; exiting with {checkpoint.EXIT_STOPPED}, resume with --resume auto")
                    stopped = True
                    break
                if args.checkpoint_every and progress.step % args.checkpoint_every == 0:
                    checkpoint.save(engine, args.output_dir, progress, args.keep_checkpoints)
                if progress.step >= total_steps:
                    break
            else:
                progress.epoch, progress.batch_in_epoch = progress.epoch + 1, 0
    if stopped:
        return checkpoint.EXIT_STOPPED

    wall = time.perf_counter() - t_start
    run_rates = run_meter.rates(distributed.all_sum)
    checksums = distributed.gather_to_rank0(weights_checksum(engine.module))
    metrics = None
    if dev_features is not None:
        metrics = evaluate(engine.module, dev_ex, dev_features, device, tokenizer, args, output_dir=args.output_dir)
        if metrics is not None:
            log(f"eval: {json.dumps(metrics)}")
    if rank == 0:
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
        model_lib.export(engine.module, tokenizer, args.output_dir)
        write_json_atomic(Path(args.output_dir) / "train_metrics.json", {
            "steps": progress.step, "epochs": progress.step / steps_per_epoch, "world_size": world,
            "train_batch_size": ds_config["train_batch_size"], "precision": config.precision(ds_config),
            "wall_time_s": wall, "device": dev_name, **{f"run_{k}": v for k, v in run_rates.items()},
            "last_log": last_rates, "peak_memory_gib": perf.peak_memory_gib(device), "features": report,
            "evals": evals, "weights_sha256_per_rank": checksums, "deepspeed_config": ds_config,
            "args": vars(args)})
        log(f"saved model and tokenizer to {args.output_dir} ({wall:.0f}s)")
    distributed.barrier()
    return 0


def weights_checksum(module):
    """A digest of this rank's weights: data-parallel ranks that agree end with equal digests."""
    import hashlib

    h = hashlib.sha256()
    for _, p in sorted(module.state_dict().items()):
        h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


def format_rates(step, total, loss, lr, rates, device):
    mfu = f" mfu {rates['mfu']:.1%}" if rates["mfu"] is not None else ""
    return (f"step {step}/{total} loss {loss:.4f} lr {lr:.2e} {rates['samples_per_second']:.1f} samples/s "
            f"{rates['tokens_per_second']:.0f} tok/s {rates['tflops_per_device']:.2f} TFLOP/s/dev{mfu} "
            f"peak mem {perf.peak_memory_gib(device):.1f}GiB")
