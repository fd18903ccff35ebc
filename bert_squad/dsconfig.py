"""The DeepSpeed config of a run: read as DeepSpeed's engine reads it, checked for what DeepSpeed does not check,
and finished by the rules this module owns.

`settings` reads a config (a shipped name or a JSON file) for this world size and device, and decides the batch
and learning rate. Every value the run acts on (precision, ZeRO stage and offload, optimizer, scheduler, clipping,
monitors) is DeepSpeed's own reading of the file (`Reading`: its `DeepSpeedConfig` and section models), so the
run and the engine cannot disagree. What this module adds is what DeepSpeed would trip on late, on every rank, or
read otherwise than the file says: a value JSON and DeepSpeed read differently (a string where DeepSpeed's default
is a switch or a number, `_check_read_raw`), a value that must be more than its kind (`AS_GIVEN`), NVMe offload
and monitors checked before the engine would miss them; the batch rule across world sizes (`Batch`) and the loop's
clipping (`Reading.loop_clip`). The optimizer and scheduler are DeepSpeed's to build: the run's engine builds
them (engine.py), before the run writes anything. A plan made without the job's device (`device=None`) lists what
only that device can tell (`Settings.needs`).

`Settings.finish` fills the schedule's "auto" values from the run's length and lr and returns the run's
`DeepSpeedConfig`, written beside its metrics: the user's config with the batch the run decided and "auto" where
the options decide, so that given back as --deepspeed-config it trains the same run, and follows the options
given with it. What the engine is told for this run alone (`for_engine`: its clipping off where the loop clips,
where monitors write, a universal checkpoint to load, which is resume.py's decision and never the file's) is not
in it.
"""

import contextlib
import copy
import difflib
import functools
import importlib.util
import io
import json
import math
import re
from collections.abc import Collection, KeysView, Mapping
from dataclasses import dataclass, replace
from importlib.metadata import version
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Optional

from bert_squad.config import DEFAULT_WARMUP_RATIO
from bert_squad.errors import UserError, first_line
from bert_squad.files import PathLike, probe_write, read_json

if TYPE_CHECKING:  # torch loads with DeepSpeed, not for launch and sweep
    import torch

SHIPPED_DIR = Path(__file__).resolve().parent / "configs"  # package data: there in installed copies too

# Monitor sections DeepSpeed writes files for (an empty output_path means: relative to the working directory).
FILE_MONITORS = ("tensorboard", "csv_monitor")
MONITOR_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "comet": "comet_ml"}
MONITORS = ("tensorboard", "csv_monitor", "wandb", "comet")  # DeepSpeed's monitor sections
# The sections read here, which must be objects with object params.
SECTIONS = ("fp16", "bf16", "torch_autocast", "zero_optimization", "optimizer", "scheduler")
# The sections the run acts on that DeepSpeed reads through a pydantic model: where DeepSpeed's reading keeps each.
MODELS = {"fp16": "float16_config", "bf16": "bfloat16_config", "bfloat16": "bfloat16_config"}
MODELS.update(zero_optimization="zero_config", **{m: f"monitor_config.{m}" for m in MONITORS})

# Values DeepSpeed reads raw (no model of its checks them) are of the kind its default is (`_check_read_raw`). These
# must be more than that, or the engine would divide by a zero, train unclipped, or act on a string ("no" is true).
COUNT, RATE, NORM = "a positive integer", "a positive number", "a norm of 0 or more (0: no clipping)"
OPTIONAL_SWITCH = "true, false or null"


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


IS_KIND: dict[str, Callable[[Any], bool]] = {
    OPTIONAL_SWITCH: lambda v: v is None or isinstance(v, bool),
    COUNT: lambda v: _number(v) and isinstance(v, int) and v > 0,
    RATE: lambda v: _number(v) and v > 0,
    NORM: lambda v: _number(v) and v >= 0,
}
# The optimizer's switches: DeepSpeed's engine pops the first three before it builds the optimizer, torch.optim's
# classes take the others (null: their default).
OPTIMIZER_SWITCHES = ["torch_adam", "adam_w_mode", "fp32_optimizer_states", "fused", "foreach", "amsgrad", "maximize"]
OPTIMIZER_SWITCHES += ["capturable", "differentiable", "decoupled_weight_decay"]
BATCH_KEYS = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size")
AS_GIVEN = {
    **dict.fromkeys(BATCH_KEYS, COUNT),
    "steps_per_print": COUNT,
    "gradient_clipping": NORM,
    "optimizer.params.lr": RATE,  # DeepSpeed's fused Adam would take a negative one
    **{f"optimizer.params.{key}": OPTIONAL_SWITCH for key in OPTIMIZER_SWITCHES},
}
READ_BY_NAME = object()  # a key DeepSpeed looked up without a default (`cfg[key]`, `key in cfg`)


class _Recording(dict):
    """A config dict that notes every key looked up in it (dotted, within sections), with the default the lookup
    gave (`READ_BY_NAME` where it gave none): what DeepSpeed's config reads, and how."""

    def __init__(self, items: Mapping[str, Any], seen: dict[str, Any], prefix: str = "") -> None:
        super().__init__(items)
        self.seen, self.prefix = seen, prefix

    def __copy__(self) -> "_Recording":
        return _Recording(self, self.seen, self.prefix)

    def _note(self, key: object, default: Any = READ_BY_NAME) -> None:
        name = f"{self.prefix}{key}"
        if self.seen.get(name, READ_BY_NAME) is READ_BY_NAME:
            self.seen[name] = default

    def _within(self, key: str, value: Any) -> Any:
        return _Recording(value, self.seen, f"{self.prefix}{key}.") if type(value) is dict else value

    def __contains__(self, key: object) -> bool:
        self._note(key)
        return super().__contains__(key)

    def __getitem__(self, key: str) -> Any:
        self._note(key)
        return self._within(key, super().__getitem__(key))

    def get(self, key: str, default: Any = None) -> Any:
        self._note(key, default)
        return self._within(key, super().get(key, default))

    def keys(self) -> "_RecordingKeys":  # type: ignore[override]
        return _RecordingKeys(self)


class _RecordingKeys(KeysView):
    _mapping: _Recording

    def __contains__(self, key: object) -> bool:
        return key in self._mapping


def _reads(cfg: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """DeepSpeed's DeepSpeedConfig of `cfg` (or whatever it raised reading it: every such error is the config's),
    and the keys it read with their defaults."""
    from deepspeed.runtime.config import DeepSpeedConfig  # heavy: not for launch and sweep

    seen: dict[str, Any] = {}
    try:
        return DeepSpeedConfig(_Recording(cfg, seen)), seen
    except Exception as err:
        return err, seen


@functools.cache
def deepspeed_keys() -> frozenset[str]:
    """The top-level keys DeepSpeed's config reads, noted while it parses a minimal config: the installed
    DeepSpeed is the judge, not a hand-kept list. (DeepSpeed itself ignores a key it does not read, so a
    misspelt one would silently change nothing.)"""
    minimal, seen = _reads({"train_micro_batch_size_per_gpu": 1})
    if isinstance(minimal, Exception):  # the installed DeepSpeed and its pydantic do not go together
        raise UserError(
            f"DeepSpeed {version('deepspeed')} cannot read a minimal config with pydantic {version('pydantic')} "
            f"here: {first_line(minimal)}"
        )
    return frozenset(key for key in seen if "." not in key)


def shipped_names() -> list[str]:
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.json"))


def locate(name_or_path: PathLike, base: PathLike = ".") -> Path:
    """The rule that names a config: an existing file (a relative path from `base`, the directory the run starts
    in), else a shipped config by name (`ds_bf16` or `ds_bf16.json`)."""
    path = Path(name_or_path)
    if (Path(base) / path).is_file():
        return Path(base) / path
    shipped = SHIPPED_DIR / (path.name if path.suffix == ".json" else path.name + ".json")
    if path.parent == Path(".") and shipped.is_file():
        return shipped
    raise UserError(
        f"{name_or_path}: no such DeepSpeed config (a JSON file, or one of {', '.join(shipped_names())})"
        + _nearest_config(path, Path(base))
    )


def _nearest_config(path: Path, base: Path) -> str:
    """The end of `locate`'s refusal that names the config nearest the one not found: a shipped one for a bare
    name, else a JSON file in the folder the path names; nothing where none is near."""
    if path.parent == Path("."):
        close = difflib.get_close_matches(path.stem, shipped_names(), n=1)
    else:
        folder = base / path.parent
        stems = sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []
        close = [str(path.parent / f"{stem}.json") for stem in difflib.get_close_matches(path.stem, stems, n=1)]
    return f"; did you mean '{close[0]}'?" if close else ""


def load(name_or_path: PathLike) -> dict[str, Any]:
    """The named config's top-level object (`locate`, then `read`)."""
    return read(locate(name_or_path))


def read(path: Path) -> dict[str, Any]:
    """The config file's top-level object; keys DeepSpeed does not read are refused, with a suggestion."""
    cfg = read_object(path)
    unknown = sorted(set(cfg) - deepspeed_keys())
    if unknown:
        close = difflib.get_close_matches(unknown[0], deepspeed_keys(), n=1)
        hint = f"did you mean '{close[0]}'?" if close else "see the DeepSpeed config documentation"
        raise UserError(f"{path}: unknown key '{unknown[0]}' ({hint})")
    return cfg


def read_object(path: Path) -> dict[str, Any]:
    """The config file's top-level JSON object, read without DeepSpeed: checked before a command loads it."""
    cfg = read_json(path, what="a DeepSpeed config")
    if not isinstance(cfg, dict):
        raise UserError(f"{path}: a DeepSpeed config is a JSON object")
    return cfg


@dataclass(frozen=True)
class Batch:
    """Micro batch per rank x gradient accumulation x ranks: the global batch of one optimizer step."""

    micro: int
    accumulation: int
    world_size: int

    @property
    def size(self) -> int:
        """The batch rule, written here only: global batch = micro x accumulation x world size."""
        return self.micro * self.accumulation * self.world_size

    def keeping(self, size: int) -> Optional["Batch"]:
        """This world's batch with a global batch of `size`: the accumulation changes first (the micro batch
        is what fits on a device), and the micro batch shrinks where `size` leaves each rank less than one;
        None where `size` cannot be split evenly over the ranks."""
        per_rank = Batch(1, 1, self.world_size)
        if size % per_rank.size:
            return None
        samples = size // per_rank.size
        micro = max(m for m in range(1, min(self.micro, samples) + 1) if samples % m == 0)
        return Batch(micro, samples // micro, self.world_size)


@dataclass(frozen=True)
class Reading:
    """DeepSpeed's own reading of a config, the one its engine acts on (`deepspeed.runtime.config.
    DeepSpeedConfig`, the pydantic models of its sections within), and what the run takes from it."""

    engine: Any  # DeepSpeed's DeepSpeedConfig
    defaults: Mapping[str, Any]  # each key DeepSpeed read (dotted within sections), with the default it read it with

    @classmethod
    def of(cls, cfg: Mapping[str, Any], path: PathLike = "the DeepSpeed config") -> "Reading":
        """`cfg` read by DeepSpeed for one process (a train_batch_size left out: across worlds the batch is
        `Batch`'s rule). Where DeepSpeed refuses it, each top-level key is read alone to name the one at fault."""
        plain = {key: value for key, value in cfg.items() if key != "train_batch_size"}
        whole, seen = _reads(plain)
        _check_read_raw(plain, seen, path)  # also where DeepSpeed raised on a value of another kind than its default
        if isinstance(whole, Exception):
            batch_keys = {k: v for k, v in plain.items() if k in BATCH_KEYS}
            for key in plain:
                alone, _ = _reads({**batch_keys, key: plain[key]})
                if isinstance(alone, Exception):
                    raise UserError(_refusal(path, key, alone)) from None
            raise UserError(_refusal(path, None, whole)) from None
        return cls(whole, MappingProxyType(seen))

    @property
    def precision(self) -> str:
        """What the model computes in: DeepSpeed's fp16 or bf16 weights, or torch autocast's dtype over fp32
        weights (its DtypeEnum name)."""
        from deepspeed.runtime.config import DtypeEnum  # DeepSpeed's own names of a dtype

        ds = self.engine
        if self.half_weights:
            return "fp16" if ds.float16_config.enabled else "bf16"
        return DtypeEnum(ds.torch_autocast_dtype).name if ds.torch_autocast_enabled else "fp32"

    @property
    def half_weights(self) -> bool:
        """DeepSpeed's fp16 or bf16 section: the weights in 16 bits, stepped by an optimizer wrapper of its own."""
        return bool(self.engine.float16_config.enabled or self.engine.bfloat16_config.enabled)

    @property
    def precision_path(self) -> str:
        """How the model reaches its precision: DeepSpeed's 16-bit weights, stepped by its own optimizer wrapper,
        or torch autocast over fp32 weights, stepped by the optimizer itself. The two save different optimizer
        states, so a checkpoint of one does not resume in the other even where the precision's name is the same."""
        if self.half_weights:
            return f"{self.precision} weights in DeepSpeed's 16-bit optimizer"
        if self.engine.torch_autocast_enabled:
            return f"{self.precision} autocast over fp32 weights"
        return "fp32 weights"

    @property
    def zero_stage(self) -> int:
        return int(self.engine.zero_optimization_stage)

    @property
    def loop_clip(self) -> float:
        """The gradient norm the training loop clips to itself, where DeepSpeed would clip the fp32 gradients one
        tensor at a time (`gradient_clipping` with neither a 16-bit section nor ZeRO, whose wrappers clip a flat
        buffer): about five aten ops a tensor, a thousand a step for BERT-base, where torch's foreach clipping
        dispatches a handful for the same norm."""
        plain = self.zero_stage == 0 and not self.half_weights
        return float(self.engine.gradient_clipping) if plain else 0.0

    @property
    def learning_rate(self) -> Optional[float]:
        return (self.engine.optimizer_params or {}).get("lr")

    @property
    def weight_decay(self) -> float:
        return (self.engine.optimizer_params or {}).get("weight_decay", 0.0)

    def offload(self, kind: str) -> Any:
        """ZeRO's offload_param or offload_optimizer section as DeepSpeed reads it (None: not offloaded)."""
        section = getattr(self.engine.zero_config, kind)
        return section if section is not None and section.device != "none" else None

    def monitor(self, name: str) -> Any:
        """The monitor section `name` (tensorboard, csv_monitor, wandb, comet) as DeepSpeed reads it."""
        return getattr(self.engine.monitor_config, name)


def _refusal(path: PathLike, key: Optional[str], err: Exception) -> str:
    """DeepSpeed's refusal of the top-level `key` (None: of the whole config) in one line naming it: a pydantic
    model names keys within its section."""
    from pydantic import ValidationError  # with DeepSpeed, not for launch and sweep

    if isinstance(err, ValidationError):
        first = err.errors()[0]
        loc = [str(part) for part in first["loc"]]
        if key is not None and loc[:1] != [key]:
            loc.insert(0, key)
        if first["type"] == "extra_forbidden":
            what = "unknown key"
        elif first["type"] == "enum":  # DeepSpeed's enums alias a member (stage 3 as MAX_STAGE): each value once
            values = dict.fromkeys(first["ctx"]["expected"].replace(" or ", ", ").split(", "))
            what = f"must be one of {', '.join(values)}, not {first['input']!r}"
        else:
            what = first["msg"].lower()
        return f"{path}: {'.'.join(loc)}: {what}"
    return f"{path}: {key or 'the config'}: DeepSpeed refuses it: {first_line(err)}"


class _Read:
    """What the dataclasses below act on, from DeepSpeed's reading of the config they hold."""

    reading: Reading

    @property
    def precision(self) -> str:
        return self.reading.precision

    @property
    def precision_path(self) -> str:
        return self.reading.precision_path

    @property
    def zero_stage(self) -> int:
        return self.reading.zero_stage

    @property
    def loop_clip(self) -> float:
        """The gradient norm the training loop clips to itself (0: none, or DeepSpeed clips); the engine's copy
        has `gradient_clipping` 0 then. See `Reading.loop_clip`."""
        return self.reading.loop_clip

    @property
    def weight_decay(self) -> float:
        return self.reading.weight_decay


@dataclass(frozen=True)
class DeepSpeedConfig(_Read):
    """The run's config, finished: what it holds cannot change. `text` is the file written beside the run: the
    user's config with the batch the run decided, and "auto" where the run fills a value from its options (the
    schedule's length, warmup and peak rate), so that given back as --deepspeed-config it trains the same run with
    the same options and follows other options given with it. `as_dict` is the config the run trained with, filled;
    `for_engine` is what DeepSpeed is handed for this run."""

    path: Path  # the file it came from
    batch: Batch
    values: MappingProxyType  # the whole config as written, read-only
    fills: MappingProxyType  # the scheduler params the run fills from its options where `values` says "auto"
    reading: Reading  # DeepSpeed's reading of it
    monitor_dir: Path  # where file monitors without an output_path write in this run
    load_universal: bool = False  # this run resumes from DeepSpeed's universal checkpoint (resume.py decides)

    def as_dict(self) -> dict[str, Any]:
        """The config the run trains with (a deep copy, for the run's records): `values` with `fills` in place."""
        cfg = copy.deepcopy(dict(self.values))
        params = cfg.get("scheduler", {}).get("params", {})
        params.update({key: value for key, value in self.fills.items() if params.get(key) == "auto"})
        return cfg

    def for_engine(self) -> dict[str, Any]:
        """What DeepSpeed is built with (a copy: it may write into the dict it is given): the run's config with
        what this run alone decided: DeepSpeed's own clipping off where the loop clips, file monitors without an
        output_path writing into the run's output dir, and a universal checkpoint to load where the run resumes
        through one."""
        cfg = self.as_dict()
        if self.loop_clip:
            cfg["gradient_clipping"] = 0.0
        for name in FILE_MONITORS:
            if self.reading.monitor(name).enabled and not self.reading.monitor(name).output_path:
                cfg[name]["output_path"] = str(self.monitor_dir)
        if self.load_universal:
            cfg["checkpoint"] = dict(cfg.get("checkpoint", {}), load_universal=True)
        return cfg

    def text(self) -> str:
        return json.dumps(self.values, indent=2, default=dict)

    def left_auto(self) -> list[str]:
        """The scheduler's values still "auto": filled from the run's length, where that was not known."""
        params = self.as_dict().get("scheduler", {}).get("params", {})
        return [f"scheduler.params.{key}" for key, value in params.items() if value == "auto"]


# The scheduler params a run fills from its options, and the options that decide each (what a refusal names).
FILLED_BY = {
    "warmup_max_lr": "the optimizer's lr (--learning-rate)",
    "total_num_steps": "the run's length (--max-steps, or --epochs of its features)",
    "warmup_num_steps": "--warmup-ratio of the run's length",
}


@dataclass(frozen=True)
class Settings(_Read):
    """A config file checked for this run, and everything the run decides on top of it but the schedule."""

    path: Path
    values: MappingProxyType  # the file's object with --learning-rate and the batch applied, read-only
    reading: Reading  # DeepSpeed's reading of it
    batch: Batch
    monitor_dir: Path  # where file monitors without an output_path write
    needs: tuple[str, ...] = ()  # what the job's device must have that this machine could not check (`device=None`)
    load_universal: bool = False  # the run resumes from DeepSpeed's universal checkpoint (resume.py decides)
    learning_rate_given: bool = False  # --learning-rate set the optimizer's lr, which the schedule then follows

    def resuming(self, batch: Batch, load_universal: bool) -> "Settings":
        """These settings for a resume that keeps a checkpoint's global batch with `batch`."""
        return replace(self, batch=batch, load_universal=load_universal)

    def finish(self, total_steps: Optional[int], warmup_ratio: Optional[float]) -> DeepSpeedConfig:
        """The finished config of a run of `total_steps` optimizer steps (None: not known here, a plan without the
        model's tokenizer: the scheduler's step counts stay "auto", filled at the job's start) that warms up over
        `warmup_ratio` of them (None: not given, `DEFAULT_WARMUP_RATIO`). A scheduler value the file fixes that
        the options decide otherwise is refused: an option typed never loses to a file in silence."""
        cfg = copy.deepcopy(dict(self.values))
        cfg.update(
            train_micro_batch_size_per_gpu=self.batch.micro,
            train_batch_size=self.batch.size,
            gradient_accumulation_steps=self.batch.accumulation,
        )
        fills: dict[str, Any] = {"warmup_max_lr": self.reading.learning_rate}
        if total_steps is not None:  # at least one warmup step: DeepSpeed's schedulers refuse 0
            ratio = DEFAULT_WARMUP_RATIO if warmup_ratio is None else warmup_ratio
            fills.update(total_num_steps=total_steps, warmup_num_steps=max(math.ceil(total_steps * ratio), 1))
        decided = {"warmup_max_lr": self.learning_rate_given, "total_num_steps": True}
        decided["warmup_num_steps"] = warmup_ratio is not None
        params = cfg.get("scheduler", {}).get("params", {})
        for key, value in fills.items():
            fixed = params.get(key, "auto")
            if fixed != "auto" and decided[key] and fixed != value:
                raise UserError(
                    f"{self.path}: scheduler.params.{key} is {fixed}, where {FILLED_BY[key]} makes it {value}: write "
                    f'"auto" there to follow the options'
                )
        return DeepSpeedConfig(
            self.path,
            self.batch,
            MappingProxyType(cfg),
            MappingProxyType(fills),
            self.reading,
            self.monitor_dir,
            self.load_universal,
        )


def settings(
    raw: Mapping[str, Any],
    path: PathLike,
    *,
    world_size: int,
    device: Optional["torch.device"],
    learning_rate: Optional[float] = None,
    micro_batch_size: Optional[int] = None,
    gradient_accumulation_steps: Optional[int] = None,
    monitors: Optional[Collection[str]] = None,
    output_dir: PathLike = ".",
) -> Settings:
    """`raw` (from `load`) checked for this world size on `device`, the run's (None: a plan on a machine without
    the job's GPU, where what needs the job's device becomes one of `Settings.needs`), with its batch and learning
    rate decided; `monitors`: the monitor sections turned on, every other one off (None: the file's)."""
    for key in SECTIONS:
        if not isinstance(raw.get(key, {}), dict) or not isinstance(raw.get(key, {}).get("params", {}), dict):
            raise UserError(f"{path}: '{key}' and its 'params' must be JSON objects")
    _check_as_given(raw, path)
    if "load_universal" in raw.get("checkpoint", {}):
        raise UserError(
            f"{path}: checkpoint.load_universal: how a checkpoint loads is the run's decision (a universal "
            f"checkpoint where it resumes on another number of ranks); remove the key"
        )
    cfg = json.loads(json.dumps(raw))  # a copy: `raw` stays as the file gave it
    if learning_rate is not None:
        cfg.setdefault("optimizer", {}).setdefault("params", {})["lr"] = learning_rate
    if micro_batch_size is not None:
        # The global batch follows from the new micro batch by the batch rule, not from the file's total.
        cfg.pop("train_batch_size", None)
        cfg["train_micro_batch_size_per_gpu"] = micro_batch_size
    if gradient_accumulation_steps is not None:  # likewise; the micro batch stays the file's (or the option's)
        cfg["train_micro_batch_size_per_gpu"] = _batch(cfg, path, world_size).micro
        cfg.pop("train_batch_size", None)
        cfg["gradient_accumulation_steps"] = gradient_accumulation_steps
    if monitors is not None:  # these monitors on, every other one the file turns on off
        for name in MONITORS:
            section = cfg.get(name, {})
            if isinstance(section, dict) and (name in monitors or section.get("enabled")):
                cfg[name] = {**section, "enabled": name in monitors}
    batch = _batch(cfg, path, world_size)
    cfg.update(train_micro_batch_size_per_gpu=batch.micro, gradient_accumulation_steps=batch.accumulation)
    reading = Reading.of(cfg, path)
    _check_same_reading(cfg, reading, path)
    needs = [*_check_precision(reading, path, device), *_check_offload(reading, path, device is None)]
    _check_monitors(reading, path)
    monitor_dir = Path(output_dir) / "monitor"
    given = learning_rate is not None
    return Settings(Path(path), MappingProxyType(cfg), reading, batch, monitor_dir, tuple(needs), False, given)


def _check_as_given(cfg: Mapping[str, Any], path: PathLike) -> None:
    """Each value of `AS_GIVEN` that the config gives is of its kind, and no optimizer or scheduler param is a
    number or switch in quotes ("1e-3"), which the class they go to takes as the string it is."""
    for key, kind in AS_GIVEN.items():
        *sections, name = key.split(".")
        within = functools.reduce(lambda section, part: section.get(part, {}), sections, cfg)
        if name in within and not IS_KIND[kind](within[name]):
            raise UserError(f"{path}: {key} must be {kind}, not {within[name]!r}")
    for section in ("optimizer", "scheduler"):
        for key, value in cfg.get(section, {}).get("params", {}).items():
            with contextlib.suppress(ValueError):
                if isinstance(value, str) and isinstance(json.loads(value), (bool, int, float)):
                    raise UserError(f"{path}: {section}.params.{key} is the string {json.dumps(value)}: write {value}")


def _check_read_raw(cfg: Mapping[str, Any], defaults: Mapping[str, Any], path: PathLike) -> None:
    """Each value DeepSpeed read with a default that is a switch or a number (no model of its checks those: it acts
    on them as JSON gives them) is one too: "false" would act as true, "2" fail deep in a step."""
    for key, default in defaults.items():
        *sections, name = key.split(".")
        within = functools.reduce(lambda section, part: section.get(part, {}), sections, cfg)
        if not isinstance(within, dict) or name not in within:
            continue
        value = within[name]
        if isinstance(default, bool) and not isinstance(value, bool):
            raise UserError(f"{path}: {key} must be true or false, not {value!r}")
        if _number(default) and not _number(value):
            raise UserError(f"{path}: {key} must be a number, not {value!r}")


def _batch(cfg: Mapping[str, Any], path: PathLike, world_size: int) -> Batch:
    """The batch from whichever of the three batch keys the config gives."""
    gas = cfg.get("gradient_accumulation_steps", 1)
    if "train_micro_batch_size_per_gpu" in cfg:
        batch = Batch(cfg["train_micro_batch_size_per_gpu"], gas, world_size)
        if cfg.get("train_batch_size", batch.size) != batch.size:
            raise UserError(
                f"{path}: train_batch_size {cfg['train_batch_size']} != train_micro_batch_size_per_gpu {batch.micro} "
                f"x gradient_accumulation_steps {gas} x world size {world_size}; remove train_batch_size "
                f"to derive it"
            )
        return batch
    if "train_batch_size" not in cfg:
        raise UserError(f"{path}: give train_micro_batch_size_per_gpu (or train_batch_size)")
    total, per_sample = cfg["train_batch_size"], Batch(1, gas, world_size)
    if total % per_sample.size:
        raise UserError(
            f"{path}: train_batch_size {total} is not divisible by gradient_accumulation_steps "
            f"{gas} x world size {world_size}"
        )
    return Batch(total // per_sample.size, gas, world_size)


def _check_same_reading(cfg: Mapping[str, Any], reading: Reading, path: PathLike) -> None:
    """Each value of a section DeepSpeed reads through a pydantic model (`MODELS`) is what JSON says it is: a
    string such as "false" that the model reads as a switch or a number, or a switch read as a number, is refused
    with what to write instead."""
    for section, where in MODELS.items():
        if isinstance(cfg.get(section), dict):
            _same(cfg[section], functools.reduce(getattr, where.split("."), reading.engine), section, path)


def _same(section: Mapping[str, Any], model: Any, where: str, path: PathLike) -> None:
    """`section` of the config at `where` against `model`, DeepSpeed's reading of it, nested sections within."""
    from pydantic import BaseModel  # with DeepSpeed, not for launch and sweep

    names = {info.alias or name: name for name, info in type(model).model_fields.items()}
    for key, value in section.items():
        held = getattr(model, names.get(key, key), None)
        if isinstance(value, dict) and isinstance(held, BaseModel):
            _same(value, held, f"{where}.{key}", path)
        elif isinstance(held, (bool, int, float)) and isinstance(value, (str, bool)) and type(value) is not type(held):
            given = ("the string " if isinstance(value, str) else "") + json.dumps(value)
            raise UserError(
                f"{path}: {where}.{key} is {given}, which DeepSpeed reads as {json.dumps(held)}: "
                f"write {json.dumps(held)}"
            )


def _check_precision(reading: Reading, path: PathLike, device: Optional["torch.device"]) -> list[str]:
    """One precision, of one that this project plans for, on `device`; what the job's device must have."""
    from deepspeed.runtime.config import DtypeEnum  # DeepSpeed's own names of a dtype

    ds = reading.engine
    switches = {"fp16": ds.float16_config.enabled, "bf16": ds.bfloat16_config.enabled}
    chosen = [f"{name}.enabled" for name, on in {**switches, "torch_autocast": ds.torch_autocast_enabled}.items() if on]
    if len(chosen) > 1:
        raise UserError(f"{path}: {' and '.join(chosen)} are each true; choose one")
    dtype = ds.torch_autocast_dtype and DtypeEnum(ds.torch_autocast_dtype).name
    if ds.torch_autocast_enabled and dtype not in ("fp16", "bf16"):
        raise UserError(f"{path}: torch_autocast.dtype must be bfloat16 or float16, not {dtype!r}")
    if not ds.float16_config.enabled:  # DeepSpeed's fp16 weights; fp16 autocast runs anywhere
        return []
    if device is None:
        return ["fp16.enabled: a GPU (DeepSpeed's fp16 weights run on a GPU only)"]
    if device.type == "cpu":
        raise UserError(
            f"{path}: fp16.enabled needs a GPU and none is visible; on a CPU use ds_fp32, or ds_bf16 where it computes "
            f"bf16 (or name no config: the run chooses by the CPU)"
        )
    return []


def _check_offload(reading: Reading, path: PathLike, planning: bool) -> list[str]:
    """ZeRO's offload to NVMe: its directory exists and takes files, and DeepSpeed's async_io op can be built
    here (without either the engine stops on every rank). In a plan for other nodes (`planning`), what fails
    here is what the job's nodes must have."""
    needs = []
    for kind in ("offload_param", "offload_optimizer"):
        offload = reading.offload(kind)
        if offload is None or offload.device != "nvme":
            continue
        key = f"zero_optimization.{kind}"
        for what, why in (
            (f"{key}.nvme_path {offload.nvme_path}", _unwritable(offload.nvme_path)),
            (f"{key}.device nvme", _async_io_missing()),
        ):
            if why and not planning:
                raise UserError(f"{path}: {what}: {why}")
            if why:
                needs.append(f"{what} on the job's nodes (here: {why})")
    return needs


def _unwritable(directory: Optional[Path]) -> Optional[str]:
    """Why files cannot be written into `directory` (None: they can)."""
    if directory is None:
        return "no nvme_path given"
    try:
        probe_write(directory)
    except OSError as err:
        return f"cannot be written: {err.strerror or err}"
    return None


def _async_io_missing() -> Optional[str]:
    """Why DeepSpeed's async_io op (NVMe offload's reads and writes) cannot be built here (None: it can)."""
    from deepspeed.accelerator import get_accelerator  # heavy: not for launch and sweep

    builder, said = get_accelerator().create_op_builder("AsyncIOBuilder"), io.StringIO()
    with contextlib.redirect_stdout(said):  # the builder prints why, in colour
        if builder is not None and builder.is_compatible(verbose=True):
            return None
    why = [line.strip() for line in re.sub(r"\x1b\[[0-9;]*m|\[WARNING\]", "", said.getvalue()).splitlines()]
    return f"DeepSpeed's async_io op cannot be built: {next(filter(None, why), 'not on this accelerator')}"


def _check_monitors(reading: Reading, path: PathLike) -> None:
    """A monitor needs its package, which DeepSpeed would only miss at the first step."""
    for section, package in MONITOR_PACKAGES.items():
        if reading.monitor(section).enabled and importlib.util.find_spec(package) is None:
            raise UserError(f"{path}: {section}.enabled needs the {package} package (pip install {package})")
