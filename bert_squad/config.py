"""The run configuration: typed, frozen, built once from the command line.

Each dataclass is one option group; a field's `help` is its documentation and its `--flag`. Commands
add the groups they use to their own parser (`add_options`) and build the dataclass from the parsed
namespace (`from_args`), so every command spells and checks a shared option the same way: the options
several commands take (`--cache-dir`, `--lang`, a trained model's `--model-dir`) are fields here, and
`--debug` is every parser's (`ArgumentParser`). Functions take the group they need, never the namespace.
`training_options` describes the training options for code that writes training command lines (the
cluster's launch and sweep) without parsing them.
"""

import argparse
import dataclasses
import json
import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, NoReturn, Optional, TypeVar, cast

from bert_squad import __version__, choices, commands, outputs
from bert_squad.cache import resolve_cache_dir
from bert_squad.errors import DEBUG_FLAG, UserError
from bert_squad.metrics import LANGUAGES

# The share of a run's steps its learning rate warms up over, where --warmup-ratio is not given (Hugging Face's
# run_qa.py examples and BERT's own recipe warm up over a tenth).
DEFAULT_WARMUP_RATIO = 0.1
# Hub datasets a run can name, and whether each has unanswerable questions (SQuAD v2.0).
HUB_DATASETS = {"squad": False, "squad_v2": True}


def option(
    default: Any,
    help: str,
    flag: Optional[str] = None,
    sweep: str = "grid",
    aliases: tuple[str, ...] = (),
    **kwargs: Any,
) -> Any:
    """A dataclass field that is also a command-line option (`flag` defaults to --field-name; `aliases` are
    other spellings it still takes, shown after it in the help).

    `sweep` says what a sweep may do with it: "grid" vary it, "common" keep it the same for every run (the
    model, data and cache, so the runs share one feature cache), "per-run" leave it to the sweep (seed,
    output dir, resume)."""
    return field(default=default, metadata=dict(help=help, flag=flag, sweep=sweep, aliases=aliases, **kwargs))


def cache_dir_option() -> Any:
    """`--cache-dir`, as every command that reads the cache takes it."""
    return option(None, "model/dataset/feature cache (default $BERT_SQUAD_CACHE or ./cache)", sweep="common")


def _within(obj: object, names: Collection[str], what: str, low: float = -math.inf, high: float = math.inf) -> None:
    """Each option (if given) a finite number from `low` to `high`: NaN, infinities and values out of range
    are one line, instead of a traceback deep in the run."""
    for name in names:
        value = getattr(obj, name)
        if value is not None and not (math.isfinite(value) and low <= value <= high):
            raise UserError(f"--{name.replace('_', '-')} {value}: must be {what}")


def _positive(obj: object, *names: str) -> None:
    for name in names:
        if getattr(obj, name) <= 0:
            raise UserError(f"--{name.replace('_', '-')} must be positive, not {getattr(obj, name)}")


@dataclass(frozen=True)
class DataConfig:
    """data and model"""

    model: str = option(
        "bert-base-uncased",
        "hub name (from the cache) or local model directory",
        sweep="common",
        aliases=("--model_name_or_path",),
    )
    dataset: str = option(
        "squad", "hub dataset in the cache: squad or squad_v2", sweep="common", aliases=("--dataset_name",)
    )
    train_file: Optional[str] = option(
        None, "local SQuAD JSON (v1.1 or v2.0) instead of --dataset", sweep="common", aliases=("--train_file",)
    )
    eval_file: Optional[str] = option(
        None,
        "local SQuAD JSON to evaluate on (default: the dataset's validation split)",
        sweep="common",
        aliases=("--validation_file",),
    )
    cache_dir: str = cache_dir_option()  # None (the default) is resolved here
    output_dir: str = option(
        "runs/bert-squad",
        "where the model, metrics, predictions and checkpoints go",
        sweep="per-run",
        aliases=("--output_dir",),
    )
    strict: bool = option(False, "an answer_start that misses its text, or an empty question, is an error, not a skip")
    no_eval: bool = option(False, "skip the final evaluation")
    no_export: bool = option(False, "write the metrics but no model: no export and no weight digests (benchmarks)")

    def __post_init__(self) -> None:
        if self.dataset not in HUB_DATASETS:
            raise UserError(
                f"unknown dataset '{self.dataset}': choose one of {', '.join(HUB_DATASETS)} "
                f"or give --train-file/--eval-file"
            )
        # resolved once here, so every part of the run sees the same cache
        object.__setattr__(self, "cache_dir", resolve_cache_dir(self.cache_dir))


@dataclass(frozen=True)
class WindowConfig:
    """windows: how a question and a long context become model inputs"""

    max_seq_length: int = option(
        384, "tokens per window (question + context + special tokens)", aliases=("--max_seq_length",)
    )
    doc_stride: int = option(
        None,
        "tokens shared by consecutive windows of a long context; where not given, "  # None: resolved here
        "128, or less where --max-seq-length leaves less room",
        aliases=("--doc_stride",),
    )
    max_query_length: int = option(64, "questions are cut to this many tokens")

    def __post_init__(self) -> None:
        _positive(self, "max_seq_length", "max_query_length")
        room = self.max_seq_length - self.max_query_length - 3  # [CLS] question [SEP] context [SEP]
        if room < 2:
            raise UserError(
                f"--max-seq-length {self.max_seq_length} leaves no room for context after "
                f"--max-query-length {self.max_query_length} and 3 special tokens"
            )
        stride = min(128, room // 2) if self.doc_stride is None else self.doc_stride
        object.__setattr__(self, "doc_stride", stride)
        _positive(self, "doc_stride")
        if stride >= room:
            raise UserError(
                f"--doc-stride {stride} must leave room for context: it has to be smaller "
                f"than --max-seq-length minus --max-query-length minus 3 special tokens ({room})"
            )


@dataclass(frozen=True)
class PreprocessConfig:
    """preprocessing: how features are built"""

    preprocessing_workers: Optional[int] = option(
        None,
        "processes that build features (default: one per core this "
        "rank may use); the cached features are the same for any",
        sweep="common",
        aliases=("--preprocessing_num_workers",),
    )

    def __post_init__(self) -> None:
        if self.preprocessing_workers is not None:
            _positive(self, "preprocessing_workers")


@dataclass(frozen=True)
class PostprocessConfig:
    """answers: how window logits become one answer per question, and how answers are scored"""

    max_answer_length: int = option(30, "longest answer span, in tokens", aliases=("--max_answer_length",))
    n_best_size: int = option(
        20, "the best starts and ends a window's spans are made of, and the candidates kept", aliases=("--n_best_size",)
    )
    null_score_diff_threshold: float = option(
        0.0,
        "SQuAD v2.0: predict no answer when the null score beats the best span by more than this",
        aliases=("--null_score_diff_threshold",),
    )
    # how answers are compared with the references (metrics.normalize_answer)
    lang: Optional[str] = option(
        None,
        f"score with MLQA's normalization for this language ({', '.join(LANGUAGES)}: "
        f"Unicode punctuation, the language's articles, zh per character) instead of "
        f"SQuAD's English one",
        choices=LANGUAGES,
        metavar="LANG",
        sweep="common",
    )

    def __post_init__(self) -> None:
        _positive(self, "max_answer_length", "n_best_size")
        _within(self, ["null_score_diff_threshold"], "a finite number")


# --report-to's choices, each with the DeepSpeed monitor sections it turns on (every other one off)
REPORT_TO = {"tensorboard": ("tensorboard",), "wandb": ("wandb",), "csv": ("csv_monitor",), "none": ()}


@dataclass(frozen=True)
class TrainConfig:
    """training"""

    deepspeed_config: Optional[str] = option(
        None,
        "DeepSpeed config: a shipped name (ds_fp32, ds_fp16, ds_bf16, ds_zero2, ds_zero3) or a JSON file "
        "(default: by the device, ds_bf16 where it computes bf16 natively, else ds_fp32; a resumed run keeps "
        "its checkpoint's)",
        metavar="NAME_OR_FILE",
        aliases=("--deepspeed_config", "--deepspeed"),
    )  # DeepSpeed's own scripts spell it so; Hugging Face's Trainer takes the file as --deepspeed
    bf16: bool = option(False, "train in the shipped ds_bf16: bf16 autocast over fp32 weights, as the Trainer's --bf16")
    fp16: bool = option(
        False,
        "train in the shipped ds_fp16: fp16 autocast over fp32 weights with a loss scaler, as the Trainer's --fp16 "
        "(emulated on most CPUs: many times slower than fp32)",
    )
    epochs: float = option(2.0, "passes over the training features", aliases=("--num_train_epochs",))
    max_steps: int = option(
        0, "train this many optimizer steps, whatever --epochs says (0: --epochs decide)", aliases=("--max_steps",)
    )
    learning_rate: Optional[float] = option(None, "overrides the config's optimizer lr", aliases=("--learning_rate",))
    micro_batch_size: Optional[int] = option(
        None,
        "overrides the config's train_micro_batch_size_per_gpu: the samples one device computes at once",
        aliases=("--per_device_train_batch_size",),
    )
    gradient_accumulation_steps: Optional[int] = option(
        None,
        "overrides the config's gradient_accumulation_steps: the micro batches of one optimizer step",
        aliases=("--gradient_accumulation_steps",),
    )
    warmup_ratio: Optional[float] = option(
        None,
        "the share of the steps a scheduler's warmup_num_steps of \"auto\" fills (one step at least: DeepSpeed's "
        f"schedulers take no fewer); where not given, {DEFAULT_WARMUP_RATIO}",
        aliases=("--warmup_ratio",),
    )
    seed: int = option(42, "one seed for the span head, the data order and dropout", sweep="per-run")
    eval_every: int = option(0, "evaluate every N optimizer steps (0: at the end only)")
    keep_best: bool = option(
        False,
        "with --eval-every: the model written at the end is the evaluated step's with "
        "the best dev F1 (a tie keeps the earlier step), not the last step's",
    )
    early_stopping: int = option(
        0,
        "with --eval-every: end the run after N evaluations without a better dev F1, keeping the best model (0: never)",
    )
    log_every: int = option(20, "log a line every N optimizer steps", aliases=("--logging_steps",))
    report_to: Optional[str] = option(
        None,
        "the DeepSpeed monitor the log lines' loss, lr and throughput also go to (csv: csv_monitor; none: no "
        "monitor), turned on in the run's config and every other one off (default: the config's monitors)",
        choices=list(REPORT_TO),
        aliases=("--report_to",),
    )
    dropout: Optional[float] = option(
        None,
        "dropout rate of the hidden states: every dropout in the model's config but attention's (default: its own)",
    )
    attention_dropout: Optional[float] = option(
        None,
        "dropout rate of the attention probabilities (default: the model's own); 0 keeps SDPA's fused CPU kernel, "
        "which a nonzero rate leaves for the unfused one (docs/performance.md)",
    )

    @property
    def monitors(self) -> Optional[tuple[str, ...]]:
        """The DeepSpeed monitor sections --report-to turns on, every other one off (None: as the config says)."""
        return None if self.report_to is None else REPORT_TO[self.report_to]

    @property
    def named_config(self) -> Optional[str]:
        """The DeepSpeed config the user named, by --deepspeed-config, --bf16 or --fp16 (None: the device's,
        `choices.precision`)."""
        return self.deepspeed_config or (choices.BF16 if self.bf16 else choices.FP16 if self.fp16 else None)

    @property
    def keeps_best(self) -> bool:
        """Whether the run tracks the best evaluation: --keep-best, or --early-stopping that keeps it."""
        return self.keep_best or self.early_stopping > 0

    def __post_init__(self) -> None:
        named = [flag for flag, on in (("--bf16", self.bf16), ("--fp16", self.fp16)) if on]
        if named and (len(named) > 1 or self.deepspeed_config):
            given = [*named, *([f"--deepspeed-config {self.deepspeed_config}"] if self.deepspeed_config else [])]
            raise UserError(
                f"{' and '.join(given)}: each names the run's DeepSpeed config (--bf16 ds_bf16, --fp16 ds_fp16); "
                f"give one"
            )
        _positive(self, "log_every")
        for name in ("micro_batch_size", "gradient_accumulation_steps"):
            if getattr(self, name) is not None:
                _positive(self, name)
        _within(self, ["epochs", "max_steps", "eval_every", "early_stopping"], "a finite number, 0 or more", low=0)
        if self.keeps_best and not self.eval_every:
            flag = "--keep-best" if self.keep_best else "--early-stopping"
            raise UserError(f"{flag} needs --eval-every N: the best step is chosen among the evaluated ones")
        _within(self, ["warmup_ratio"], "a fraction from 0 to 1", low=0, high=1)
        _within(self, ["dropout", "attention_dropout"], "a rate from 0 to 1", low=0, high=1)
        _within(self, ["seed"], "from 0 to 2**32 - 1", low=0, high=2**32 - 1)
        if self.epochs <= 0 and self.max_steps <= 0:
            raise UserError("nothing to train: give --epochs or --max-steps")


@dataclass(frozen=True)
class FaultConfig:
    """fault tolerance"""

    checkpoint_every: int = option(
        0, "save a checkpoint every N optimizer steps (0: only when stopped)", aliases=("--save_steps",)
    )
    keep_checkpoints: int = option(
        2,
        "the newest intact checkpoints kept; others deleted once a newer one is complete",
        aliases=("--save_total_limit",),
    )
    resume: Optional[str] = option(
        None,
        "'auto' (newest complete checkpoint, or start fresh) or a checkpoint path",
        sweep="per-run",
        aliases=("--resume_from_checkpoint",),
    )
    overwrite_output_dir: bool = option(
        False,
        "train afresh into an --output-dir that holds a run, its outputs and checkpoints removed first (without "
        "it such a dir is refused, unless --resume continues the run; other files in it stay)",
        sweep="per-run",
        aliases=("--overwrite_output_dir",),
    )
    dist_timeout: int = option(600, "seconds a collective may wait for a lost rank", aliases=("--ddp_timeout",))

    def __post_init__(self) -> None:
        _positive(self, "keep_checkpoints", "dist_timeout")
        _within(self, ["checkpoint_every"], "0 or more (0: only when stopped)", low=0)

    def check_output_dir(self, output_dir: str) -> None:
        """A training into `output_dir` that holds a run continues it (--resume) or replaces it
        (--overwrite-output-dir), or is refused in one line (`outputs.refuse_used`); not both."""
        if self.resume and self.overwrite_output_dir:
            raise UserError("--resume continues the run in --output-dir, --overwrite-output-dir replaces it: give one")
        if not (self.resume or self.overwrite_output_dir):
            outputs.refuse_used(output_dir)


# --padding's choices, each with what it pads a micro batch to (the plan line's words; batching.Collator.for_training)
PADDINGS = {"buckets": "its length bucket", "longest": "its longest feature", "max-length": "--max-seq-length"}


@dataclass(frozen=True)
class SpeedConfig:
    """speed"""

    padding: Optional[str] = option(
        None,
        "what a training micro batch is padded to: 'buckets' (its length bucket: at most 8 shapes), "
        "'longest' (its longest feature: fewer tokens, a shape almost every step), 'max-length' "
        "(--max-seq-length, batches not grouped by length: for comparison); default: by the device, 'buckets' "
        "with --compile and on a GPU, 'longest' on a CPU",
        choices=list(PADDINGS),
    )
    compile: bool = option(
        False,
        "torch.compile the training step: a graph a length bucket, CUDA graphs on a GPU",
        aliases=("--torch_compile",),
    )
    tf32: bool = option(
        False,
        "fp32 matrix products on an NVIDIA GPU's tensor cores in TF32 (10-bit mantissa), as Hugging Face's --tf32",
    )
    peak_tflops: Optional[float] = option(None, "device peak for MFU when not in the built-in table")
    per_device_eval_batch_size: int = option(
        64,
        "the eval windows one device runs at once, in a training's evaluation and in evaluate and predict",
        aliases=("--per_device_eval_batch_size",),
    )

    def __post_init__(self) -> None:
        _within(self, ["peak_tflops"], "a positive number of TFLOP/s", low=1e-6)
        _positive(self, "per_device_eval_batch_size")


@dataclass(frozen=True)
class RunConfig:
    """Everything one training run is told, grouped as the command line groups it."""

    data: DataConfig
    windows: WindowConfig
    preprocess: PreprocessConfig
    postprocess: PostprocessConfig
    train: TrainConfig
    faults: FaultConfig
    speed: SpeedConfig


TRAINING_GROUPS = {
    "data": DataConfig,
    "windows": WindowConfig,
    "preprocess": PreprocessConfig,
    "postprocess": PostprocessConfig,
    "train": TrainConfig,
    "faults": FaultConfig,
    "speed": SpeedConfig,
}


@dataclass(frozen=True)
class ModelConfig:
    """model: a trained question-answering model, for the commands that load one"""

    model_dir: str = option(
        None,
        "a trained model: its directory (a bert-squad --output-dir) or a hub name in the cache",
        aliases=("--model-file", "--model_name_or_path"),
        required=True,
    )
    cache_dir: Optional[str] = cache_dir_option()


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's own "(default: ...)" after each option's help, where there is a value to show: not for a
    default of None (the help says what happens then), a switch's False, or an empty list."""

    def _get_help_string(self, action: argparse.Action) -> Optional[str]:
        if action.default is None or action.default is False or action.default == []:
            return action.help
        return super()._get_help_string(action)


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose complaints are UserErrors: one error line and exit code 2, like every other bad input,
    and a caller can say whose arguments they were (a job's training arguments, say). Every command's parser
    is one, so each takes --debug (read by `errors.debug_requested` before parsing) and shows its defaults."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{"formatter_class": HelpFormatter, **kwargs})
        self.add_argument(
            DEBUG_FLAG,
            action="store_true",
            help="tracebacks on errors, and DeepSpeed's info logging (also BERT_SQUAD_DEBUG=1)",
        )

    def error(self, message: str) -> NoReturn:
        raise UserError(message)


@dataclass(frozen=True)
class Option:
    """One training option, as code that writes training command lines needs to know it."""

    name: str  # the config field
    flag: str  # --learning-rate
    type: type  # what its value converts with; bool for a switch, which takes none
    sweep: str  # see `option`
    aliases: tuple[str, ...]  # the other spellings it takes (--learning_rate)

    @property
    def spellings(self) -> tuple[str, ...]:
        return (self.flag, *self.aliases)


def _option(f: dataclasses.Field) -> Option:
    meta = f.metadata
    kind = cast(type, getattr(f.type, "__args__", (f.type,))[0])  # Optional[int] -> int
    return Option(f.name, meta["flag"] or "--" + f.name.replace("_", "-"), kind, meta["sweep"], meta["aliases"])


def training_options() -> dict[str, Option]:
    """The training options by flag."""
    return {o.flag: o for cls in TRAINING_GROUPS.values() for o in map(_option, dataclasses.fields(cls))}


def add_options(
    parser: argparse.ArgumentParser,
    cls: type,
    several: Collection[str] = (),
    without: Collection[str] = (),
    only: Optional[Collection[str]] = None,
    unset: bool = False,
) -> None:
    """The fields of `cls` as an option group of `parser`; those named in `several` take one or more values
    (a command that builds one `cls` for each of several inputs), those in `without` (or not in `only`) are
    not offered (a command they mean nothing to: they keep their defaults). With `unset` an option not given
    parses to a `FromModel`, so that `given` tells what the command line said from a default that comes from
    elsewhere (a trained model's task settings: `task.resolve`)."""
    fields = dataclasses.fields(cls)
    left_out = set(without) | ({f.name for f in fields} - set(only) if only is not None else set())
    group = parser.add_argument_group((cls.__doc__ or "").strip().split(":")[0])
    # Left out, an option is never given: under `unset` its value is the model's too, as `given` reads it.
    parser.set_defaults(**{f.name: FromModel(f.default) if unset else f.default for f in fields if f.name in left_out})
    for f in (f for f in fields if f.name not in left_out):
        opt = _option(f)
        meta = {k: v for k, v in f.metadata.items() if k not in ("flag", "sweep", "aliases")}
        if opt.type is bool:
            group.add_argument(*opt.spellings, dest=f.name, action="store_true", **meta)
        else:
            group.add_argument(
                *opt.spellings,
                dest=f.name,
                type=opt.type,
                default=FromModel(f.default) if unset else f.default,
                nargs="+" if f.name in several else None,
                **meta,
            )


class FromModel:
    """The default of an option whose value a trained model records (`add_options(..., unset=True)`): what `--help`
    shows as its default, and what `given` leaves out."""

    def __init__(self, fallback: Any) -> None:
        self.fallback = fallback  # the option's own default, for a model that records none

    def __str__(self) -> str:
        return "the trained model's" + ("" if self.fallback is None else f", else {self.fallback}")


def given(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The fields of `cls` that the command line gave (parsed by `add_options(..., unset=True)`)."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)}
    return {name: value for name, value in values.items() if not isinstance(value, FromModel)}


Group = TypeVar("Group")


def from_args(cls: type[Group], args: argparse.Namespace) -> Group:
    """`cls` built from the parsed namespace: its `__post_init__` checks run here, once."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})  # type: ignore[arg-type]


_KINDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def from_record(cls: type[Group], values: dict[str, Any], where: str) -> Group:
    """`cls` built from what a file recorded (`where`, a group of a model's task settings), as its options would
    have parsed it: each value of the option's type (an integer where the option takes one, null only where the
    option's default is) and among its choices, then the group's own checks. Fields `cls` does not have are not
    read (a newer writer's); fields missing keep their defaults (an older writer's)."""
    kept = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in values:
            continue
        value, opt = values[f.name], _option(f)
        choices = f.metadata.get("choices")
        if value is None:
            fits = f.default is None
        elif opt.type is bool or isinstance(value, bool):  # JSON's true is no number, 1 no switch
            fits = opt.type is bool and isinstance(value, bool)
        elif opt.type is float:
            fits = isinstance(value, (int, float))  # JSON's 1 for 1.0
        else:
            fits = isinstance(value, opt.type) and (not choices or value in choices)
        if not fits:
            takes = f"one of {', '.join(choices)}" if choices else _KINDS[opt.type]
            raise UserError(f"{where}.{f.name} is {json.dumps(value)}, where {opt.flag} takes {takes}")
        kept[f.name] = value
    return cls(**kept)


TRAINING = (
    "bert-squad",
    "Fine-tune a BERT-family model for extractive QA on SQuAD with DeepSpeed. Subcommands: "
    f"{', '.join(commands.listed())} (bert-squad CMD --help). `--download-only` runs `download` "
    "and `--print-config` runs `config` with the same arguments.",
)
PRINT_CONFIG = (
    "bert-squad config",
    "Print a training run's resolved options and the DeepSpeed config it would hand the engine, as JSON; "
    "features are tokenized into the cache to count the steps, nothing is trained. Takes the training "
    "options (also as `bert-squad --print-config ...`).",
)


def training_parser(prog: str = TRAINING[0], description: str = TRAINING[1]) -> ArgumentParser:
    """The training options' parser; the commands that take a training run's arguments (config, download,
    check-cache) give their own name and description."""
    p = ArgumentParser(prog=prog, description=description)
    p.add_argument("--version", action="version", version=f"bert-squad {__version__}")
    for cls in TRAINING_GROUPS.values():
        add_options(p, cls)
    p.add_argument("--local_rank", type=int, default=-1, help=argparse.SUPPRESS)  # the deepspeed launcher's
    return p


def parse_run_config(argv: list[str], command: tuple[str, str] = TRAINING) -> RunConfig:
    """The training command line as a RunConfig (`command`: the prog and description of the command it is
    given to); bad values are one-line UserErrors."""
    args = training_parser(*command).parse_args(argv)
    groups: dict[str, Any] = {name: from_args(cls, args) for name, cls in TRAINING_GROUPS.items()}
    return RunConfig(**groups)


def parse_print_config(argv: list[str]) -> RunConfig:
    """`bert-squad config`'s command line: a training run's."""
    return parse_run_config(argv, PRINT_CONFIG)
