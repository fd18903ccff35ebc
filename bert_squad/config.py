"""The run configuration: typed, frozen, built once from the command line.

Each dataclass is one option group; a field's `help` is its documentation and its `--flag`. Commands
add the groups they use to their own parser (`add_options`) and build the dataclass from the parsed
namespace (`from_args`), so every command spells and checks a shared option the same way. Functions
take the group they need, never the namespace.
"""

import argparse
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Optional

from bert_squad.errors import UserError, debug_requested
from bert_squad.files import directory


def option(default, help, flag=None, **kwargs):
    """A dataclass field that is also a command-line option (`flag` defaults to --field-name)."""
    return field(default=default, metadata=dict(help=help, flag=flag, **kwargs))


def _within(obj, names, what, low=-math.inf, high=math.inf):
    """Each option (if given) a finite number from `low` to `high`: NaN, infinities and values out of range
    are one line, instead of a traceback deep in the run."""
    for name in names:
        value = getattr(obj, name)
        if value is not None and not (math.isfinite(value) and low <= value <= high):
            raise UserError(f"--{name.replace('_', '-')} {value}: must be {what}")


def _positive(obj, *names):
    for name in names:
        if getattr(obj, name) <= 0:
            raise UserError(f"--{name.replace('_', '-')} must be positive, not {getattr(obj, name)}")


@dataclass(frozen=True)
class DataConfig:
    """data and model"""

    model: str = option("bert-base-uncased", "hub name (from the cache) or local model directory")
    dataset: str = option("squad", "hub dataset in the cache: squad or squad_v2")
    train_file: Optional[str] = option(None, "local SQuAD JSON (v1.1 or v2.0) instead of --dataset")
    eval_file: Optional[str] = option(None, "local SQuAD JSON to evaluate on (default: the dataset's validation split)")
    cache_dir: Optional[str] = option(None, "model/dataset/feature cache (default $BERT_SQUAD_CACHE or ./cache)")
    output_dir: str = option("runs/bert-squad", "where the model, metrics, predictions and checkpoints go")
    download_only: bool = option(False, "fetch --model and --dataset into the cache and exit (login node with internet)")
    strict: bool = option(False, "an answer_start that misses its text, or an empty question, is an error, "
                                   "not a skip")
    no_eval: bool = option(False, "skip the final evaluation")

    def __post_init__(self):
        from bert_squad.data import HUB_DATASETS

        if self.dataset not in HUB_DATASETS:
            raise UserError(f"unknown dataset '{self.dataset}': choose one of {', '.join(HUB_DATASETS)} "
                            f"or give --train-file/--eval-file")
        if self.cache_dir is None:  # resolved once here, so every part of the run sees the same cache
            from bert_squad.cache import default_cache_dir

            object.__setattr__(self, "cache_dir", default_cache_dir())
        directory(self.cache_dir, "--cache-dir ")


@dataclass(frozen=True)
class WindowConfig:
    """windows: how a question and a long context become model inputs"""

    max_seq_length: int = option(384, "tokens per window (question + context + special tokens)")
    doc_stride: Optional[int] = option(None, "tokens shared by consecutive windows of a long context "
                                             "(default: 128, or less where --max-seq-length leaves less room)")
    max_query_length: int = option(64, "questions are cut to this many tokens")

    def __post_init__(self):
        _positive(self, "max_seq_length", "max_query_length")
        room = self.max_seq_length - self.max_query_length - 3  # [CLS] question [SEP] context [SEP]
        if room < 2:
            raise UserError(f"--max-seq-length {self.max_seq_length} leaves no room for context after "
                            f"--max-query-length {self.max_query_length} and 3 special tokens")
        if self.doc_stride is None:
            object.__setattr__(self, "doc_stride", min(128, room // 2))
        _positive(self, "doc_stride")
        if self.doc_stride >= room:
            raise UserError(f"--doc-stride {self.doc_stride} must leave room for context: it has to be smaller "
                            f"than --max-seq-length minus --max-query-length minus 3 special tokens ({room})")


@dataclass(frozen=True)
class AnswerConfig:
    """answers: how window logits become one answer per question"""

    max_answer_length: int = option(30, "longest answer span, in tokens")
    null_score_diff_threshold: float = option(0.0, "SQuAD v2.0: predict no answer when the null score beats "
                                                   "the best span by more than this")

    def __post_init__(self):
        _positive(self, "max_answer_length")
        _within(self, ["null_score_diff_threshold"], "a finite number")


@dataclass(frozen=True)
class TrainConfig:
    """training"""

    deepspeed_config: str = option("ds_fp32", "DeepSpeed config: a shipped name (ds_fp32, ds_fp16, ds_bf16, "
                                              "ds_zero2, ds_zero3) or a JSON file", flag="--deepspeed_config")
    epochs: float = option(2.0, "passes over the training features")
    max_steps: int = option(0, "stop after this many optimizer steps (0: --epochs decide)")
    learning_rate: Optional[float] = option(None, "overrides the config's optimizer lr")
    warmup_ratio: float = option(0.1, "fills a scheduler warmup_num_steps of \"auto\"")
    seed: int = option(42, "one seed for the span head, the data order and dropout")
    eval_every: int = option(0, "evaluate every N optimizer steps (0: at the end only)")
    log_every: int = option(20, "log a line every N optimizer steps")

    def __post_init__(self):
        _positive(self, "log_every")
        _within(self, ["epochs", "max_steps", "eval_every"], "a finite number, 0 or more", low=0)
        _within(self, ["warmup_ratio"], "a fraction from 0 to 1", low=0, high=1)
        _within(self, ["seed"], "from 0 to 2**32 - 1", low=0, high=2**32 - 1)
        if self.epochs <= 0 and self.max_steps <= 0:
            raise UserError("nothing to train: give --epochs or --max-steps")


@dataclass(frozen=True)
class FaultConfig:
    """fault tolerance"""

    checkpoint_every: int = option(0, "save a checkpoint every N optimizer steps (0: only when stopped)")
    keep_checkpoints: int = option(2, "complete checkpoints kept; older ones are deleted")
    resume: Optional[str] = option(None, "'auto' (newest complete checkpoint, or start fresh) or a checkpoint path")
    dist_timeout: int = option(600, "seconds a collective may wait for a lost rank")

    def __post_init__(self):
        _positive(self, "keep_checkpoints", "dist_timeout")
        _within(self, ["checkpoint_every"], "0 or more (0: only when stopped)", low=0)


@dataclass(frozen=True)
class SpeedConfig:
    """speed"""

    pad_to_max_length: bool = option(False, "pad every batch to --max-seq-length (for comparison)")
    compile: bool = option(False, "torch.compile the model")
    peak_tflops: Optional[float] = option(None, "device peak for MFU when not in the built-in table")

    def __post_init__(self):
        _within(self, ["peak_tflops"], "a positive number of TFLOP/s", low=1e-6)


@dataclass(frozen=True)
class RunConfig:
    """Everything one training run is told, grouped as the command line groups it."""

    data: DataConfig
    windows: WindowConfig
    answers: AnswerConfig
    train: TrainConfig
    faults: FaultConfig
    speed: SpeedConfig
    debug: bool = False


def add_options(parser, cls):
    """The fields of `cls` as an option group of `parser`."""
    group = parser.add_argument_group(cls.__doc__.strip().split(":")[0])
    for f in dataclasses.fields(cls):
        meta = dict(f.metadata)
        flag = meta.pop("flag") or "--" + f.name.replace("_", "-")
        if f.type is bool:
            group.add_argument(flag, dest=f.name, action="store_true", **meta)
        else:  # Optional[int] -> int
            kind = getattr(f.type, "__args__", (f.type,))[0]
            group.add_argument(flag, dest=f.name, type=kind, default=f.default, **meta)
    return group


def from_args(cls, args):
    """`cls` built from the parsed namespace: its `__post_init__` checks run here, once."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


def training_parser():
    p = argparse.ArgumentParser(
        prog="bert-squad",
        description="Fine-tune a BERT-family model for extractive QA on SQuAD with DeepSpeed. Subcommands: "
                    "score, evaluate, answer, launch, sweep, summarize, check-cache (bert-squad CMD --help).")
    for cls in (DataConfig, WindowConfig, AnswerConfig, TrainConfig, FaultConfig, SpeedConfig):
        add_options(p, cls)
    p.add_argument("--debug", action="store_true", help="tracebacks and DeepSpeed's info logging")
    p.add_argument("--local_rank", type=int, default=-1, help=argparse.SUPPRESS)  # the deepspeed launcher's
    return p


def parse_run_config(argv, parser=None):
    """The training command line as a RunConfig; bad values are one-line UserErrors."""
    args = (parser or training_parser()).parse_args(argv)
    return RunConfig(data=from_args(DataConfig, args), windows=from_args(WindowConfig, args),
                     answers=from_args(AnswerConfig, args), train=from_args(TrainConfig, args),
                     faults=from_args(FaultConfig, args), speed=from_args(SpeedConfig, args),
                     debug=args.debug or debug_requested())
