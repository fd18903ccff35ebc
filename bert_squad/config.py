"""Run configuration: the command line, and the DeepSpeed config checked before any work starts.

Batch rule: shipped configs give `train_micro_batch_size_per_gpu` and `gradient_accumulation_steps`;
the global `train_batch_size` is derived as micro x accumulation x world size. A config that also sets
`train_batch_size` must agree with that product for the current world size, or the run stops with an
error naming the keys. Scheduler values written "auto" are filled in from the run's length.
"""

import argparse
import copy
import json
import math
from pathlib import Path

from bert_squad.data import HUB_DATASETS
from bert_squad.errors import UserError

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"

KNOWN_KEYS = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer",
    "scheduler", "fp16", "bf16", "zero_optimization", "gradient_clipping", "steps_per_print",
    "wall_clock_breakdown", "zero_allow_untested_optimizer", "communication_data_type",
    "prescale_gradients", "gradient_predivide_factor", "sparse_gradients", "amp", "activation_checkpointing",
    "flops_profiler", "comms_logger", "seq_parallel_communication_data_type", "data_types",
    "dump_state", "memory_breakdown", "checkpoint", "torch_autocast", "zero_force_ds_cpu_optimizer",
}


def add_window_arguments(parser):
    """Window and answer-span options: training, `evaluate` and `bert-squad-test` must agree on them."""
    g = parser.add_argument_group("windows and answers")
    g.add_argument("--max-seq-length", type=int, default=384)
    g.add_argument("--doc-stride", type=int, default=128)
    g.add_argument("--max-query-length", type=int, default=64)
    g.add_argument("--max-answer-length", type=int, default=30)
    g.add_argument("--null-score-diff-threshold", type=float, default=0.0, help="SQuAD v2.0: predict no answer above this")


def build_parser():
    import deepspeed

    p = argparse.ArgumentParser(
        prog="bert-squad",
        description="Fine-tune a BERT-family model for extractive QA on SQuAD with DeepSpeed. "
                    "Subcommands: score, evaluate, launch, sweep, summarize (bert-squad CMD --help).")
    g = p.add_argument_group("data and model")
    g.add_argument("--model", default="bert-base-uncased", help="hub name (from the cache) or local directory")
    g.add_argument("--dataset", default="squad", help=f"hub dataset in the cache: {', '.join(HUB_DATASETS)}")
    g.add_argument("--train-file", help="local SQuAD JSON (v1.1 or v2.0) instead of --dataset")
    g.add_argument("--eval-file", help="local SQuAD JSON to evaluate on (default: the dataset's validation split)")
    g.add_argument("--cache-dir", default=None, help="model/dataset/feature cache (default $BERT_SQUAD_CACHE or ./cache)")
    g.add_argument("--output-dir", default="runs/bert-squad")
    g.add_argument("--download-only", action="store_true",
                   help="fetch --model and --dataset into the cache and exit (login node with internet)")
    g.add_argument("--strict", action="store_true", help="an answer_start that misses its text is an error, not a skip")
    add_window_arguments(p)
    g = p.add_argument_group("training")
    g.add_argument("--epochs", type=float, default=2.0)
    g.add_argument("--max-steps", type=int, default=0, help="stop after this many optimizer steps (0: epochs decide)")
    g.add_argument("--learning-rate", type=float, default=None, help="overrides the config's optimizer lr")
    g.add_argument("--warmup-ratio", type=float, default=0.1, help="fills a scheduler warmup_num_steps of \"auto\"")
    g.add_argument("--seed", type=int, default=42)
    g.add_argument("--eval-every", type=int, default=0, help="evaluate every N optimizer steps (0: at the end only)")
    g.add_argument("--log-every", type=int, default=20, help="log a line every N optimizer steps")
    g.add_argument("--no-eval", action="store_true", help="skip the final evaluation")
    g = p.add_argument_group("fault tolerance")
    g.add_argument("--checkpoint-every", type=int, default=0, help="save a checkpoint every N optimizer steps")
    g.add_argument("--keep-checkpoints", type=int, default=2)
    g.add_argument("--resume", default=None, help="'auto' (newest complete checkpoint, or start fresh) or a checkpoint path")
    g.add_argument("--dist-timeout", type=int, default=600, help="seconds a collective may wait for a lost rank")
    g = p.add_argument_group("speed")
    g.add_argument("--pad-to-max-length", action="store_true", help="pad every batch to --max-seq-length (for comparison)")
    g.add_argument("--compile", action="store_true", help="torch.compile the model")
    g.add_argument("--peak-tflops", type=float, default=None, help="device peak for MFU when not in the built-in table")
    p.add_argument("--debug", action="store_true", help="tracebacks and DeepSpeed's info logging")
    p.add_argument("--local_rank", type=int, default=-1, help=argparse.SUPPRESS)  # set by the deepspeed launcher
    deepspeed.add_config_arguments(p)
    return p


def parse_args(argv):
    args = build_parser().parse_args(argv)
    for name in ("max_seq_length", "doc_stride", "max_query_length", "max_answer_length", "log_every",
                 "keep_checkpoints", "dist_timeout"):
        if getattr(args, name) <= 0:
            raise UserError(f"--{name.replace('_', '-')} must be positive")
    if args.doc_stride >= args.max_seq_length - args.max_query_length - 3:
        raise UserError("--doc-stride must leave room for context: it has to be smaller than "
                        "--max-seq-length minus --max-query-length minus 3 special tokens")
    if args.dataset not in HUB_DATASETS:
        raise UserError(f"unknown dataset '{args.dataset}': choose one of {', '.join(HUB_DATASETS)} "
                        f"or give --train-file/--eval-file")
    if args.epochs <= 0 and args.max_steps <= 0:
        raise UserError("nothing to train: give --epochs or --max-steps")
    if args.deepspeed_config is None:
        args.deepspeed_config = str(CONFIG_DIR / "ds_fp32.json")
    return args


def load_ds_config(path):
    path = Path(path)
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: no such DeepSpeed config") from None
    except json.JSONDecodeError as err:
        raise UserError(f"{path}: malformed JSON at line {err.lineno} column {err.colno}: {err.msg}") from None
    if not isinstance(cfg, dict):
        raise UserError(f"{path}: a DeepSpeed config is a JSON object")
    unknown = sorted(set(cfg) - KNOWN_KEYS)
    if unknown:
        raise UserError(f"{path}: unknown key '{unknown[0]}' (typo? see the DeepSpeed config documentation)")
    return cfg


def _positive_int(cfg, key, path, default=None):
    value = cfg.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise UserError(f"{path}: '{key}' must be a positive integer, not {value!r}")
    return value


def resolve_ds_config(cfg, path, *, world_size, has_gpu, learning_rate=None):
    """Check the batch arithmetic and the precision against this machine; return a config to run."""
    cfg = copy.deepcopy(cfg)
    gas = _positive_int(cfg, "gradient_accumulation_steps", path, default=1)
    if "train_micro_batch_size_per_gpu" in cfg:
        micro = _positive_int(cfg, "train_micro_batch_size_per_gpu", path)
        if "train_batch_size" in cfg and _positive_int(cfg, "train_batch_size", path) != micro * gas * world_size:
            raise UserError(
                f"{path}: train_batch_size {cfg['train_batch_size']} != train_micro_batch_size_per_gpu {micro} "
                f"x gradient_accumulation_steps {gas} x world size {world_size}; remove train_batch_size "
                f"to derive it")
    else:
        total = _positive_int(cfg, "train_batch_size", path)
        if total % (gas * world_size):
            raise UserError(f"{path}: train_batch_size {total} is not divisible by gradient_accumulation_steps "
                            f"{gas} x world size {world_size}")
        micro = total // (gas * world_size)
    cfg.update(train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=gas,
               train_batch_size=micro * gas * world_size)
    if cfg.get("fp16", {}).get("enabled") and not has_gpu:
        raise UserError(f"{path}: fp16.enabled needs a GPU and none is visible; on CPU use "
                        f"configs/ds_fp32.json or configs/ds_bf16.json")
    if cfg.get("fp16", {}).get("enabled") and cfg.get("bf16", {}).get("enabled"):
        raise UserError(f"{path}: fp16.enabled and bf16.enabled are both true; choose one")
    stage = cfg.get("zero_optimization", {}).get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise UserError(f"{path}: zero_optimization.stage must be 0..3, not {stage!r}")
    opt = cfg.get("optimizer", {}).get("params", {})
    if learning_rate is not None:
        opt["lr"] = learning_rate
    if "lr" in opt and not (isinstance(opt["lr"], (int, float)) and 0 < opt["lr"] < 1):
        raise UserError(f"{path}: optimizer.params.lr must be a number in (0, 1), not {opt['lr']!r}")
    return cfg


def fill_schedule(cfg, total_steps, warmup_ratio):
    """Replace "auto" scheduler values with numbers that follow from the run's length and lr."""
    params = cfg.get("scheduler", {}).get("params", {})
    lr = cfg.get("optimizer", {}).get("params", {}).get("lr")
    fills = {"total_num_steps": total_steps, "warmup_num_steps": math.ceil(total_steps * warmup_ratio),
             "warmup_max_lr": lr}
    for key, value in fills.items():
        if params.get(key) == "auto":
            params[key] = value
    return cfg


def precision(cfg):
    if cfg.get("fp16", {}).get("enabled"):
        return "fp16"
    if cfg.get("bf16", {}).get("enabled"):
        return "bf16"
    return "fp32"
