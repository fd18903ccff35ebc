"""The DeepSpeed config of a run, built once as a finished value by the rules this module owns.

`settings` reads a config (a shipped name or a JSON file), checks it against this machine and world size,
and decides everything that does not depend on the run's length: the batch, the learning rate, where file
monitors write. `Settings.finish` fills the schedule from the run's length and returns the `DeepSpeedConfig`
the engine is built with; nothing edits it afterwards, and the run writes it beside its metrics.

Batch: shipped configs give `train_micro_batch_size_per_gpu` and `gradient_accumulation_steps`; the
global `train_batch_size` is derived by the batch rule (`Batch.size`). A config that also sets
`train_batch_size` must agree with that product for the current world size, or the run stops with an
error naming the keys. Scheduler values written "auto" are filled in from the run's length and lr.

How a checkpoint of another world resumes with this config is resume.py's decision.
"""

import copy
import difflib
import functools
import importlib.util
import json
import logging
import math
from collections.abc import KeysView, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any, Optional

from bert_squad.errors import UserError, first_line
from bert_squad.files import PathLike, read_json

SHIPPED_DIR = Path(__file__).resolve().parent / "configs"  # package data: there in installed copies too

# Monitor sections DeepSpeed writes files for (an empty output_path means: relative to the working directory).
FILE_MONITORS = ("tensorboard", "csv_monitor")
MONITOR_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "comet": "comet_ml"}
# The sections read here, which must be objects with object params.
SECTIONS = ("fp16", "bf16", "torch_autocast", "zero_optimization", "optimizer", "scheduler")
# DeepSpeed's sections that each put the model's weights in 16 bits and its optimizer in a wrapper of their own.
HALF_SECTIONS = ("fp16", "bf16")


class _Recording(dict):
    """A config dict that notes every top-level key looked up in it."""

    def __init__(self, items: Mapping[str, Any], seen: set[str]) -> None:
        super().__init__(items)
        self.seen = seen

    def __copy__(self) -> "_Recording":
        return _Recording(self, self.seen)

    def __contains__(self, key: object) -> bool:
        self.seen.add(str(key))
        return super().__contains__(key)

    def __getitem__(self, key: str) -> Any:
        self.seen.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.seen.add(key)
        return super().get(key, default)

    def keys(self) -> "_RecordingKeys":  # type: ignore[override]
        return _RecordingKeys(self)


class _RecordingKeys(KeysView):
    _mapping: _Recording

    def __contains__(self, key: object) -> bool:
        return key in self._mapping


@functools.cache
def deepspeed_keys() -> frozenset[str]:
    """The top-level keys DeepSpeed's config reads, noted while it parses a minimal config: the installed
    DeepSpeed is the judge, not a hand-kept list. (DeepSpeed itself ignores a key it does not read, so a
    misspelt one would silently change nothing.)"""
    from deepspeed.runtime.config import DeepSpeedConfig  # heavy: not for launch and sweep

    seen: set[str] = set()
    DeepSpeedConfig(_Recording({"train_micro_batch_size_per_gpu": 1}, seen))
    return frozenset(seen)


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
    raise UserError(f"{name_or_path}: no such DeepSpeed config (a JSON file, or one of {', '.join(shipped_names())})")


def load(name_or_path: PathLike) -> dict[str, Any]:
    """The named config's top-level object (`locate`, then `read`)."""
    return read(locate(name_or_path))


def read(path: Path) -> dict[str, Any]:
    """The config file's top-level object; keys DeepSpeed does not read are refused, with a suggestion."""
    cfg = read_json(path, what="a DeepSpeed config")
    if not isinstance(cfg, dict):
        raise UserError(f"{path}: a DeepSpeed config is a JSON object")
    unknown = sorted(set(cfg) - deepspeed_keys())
    if unknown:
        close = difflib.get_close_matches(unknown[0], deepspeed_keys(), n=1)
        hint = f"did you mean '{close[0]}'?" if close else "see the DeepSpeed config documentation"
        raise UserError(f"{path}: unknown key '{unknown[0]}' ({hint})")
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


class _Sections:
    """What a config's sections say, for the dataclasses below, which hold the config as `values`."""

    values: Mapping[str, Any]

    @property
    def precision(self) -> str:
        return precision(self.values)

    @property
    def zero_stage(self) -> int:
        return zero_stage(self.values)

    @property
    def precision_path(self) -> str:
        return precision_path(self.values)


@dataclass(frozen=True)
class DeepSpeedConfig(_Sections):
    """The run's config, finished: what it holds cannot change. Written beside the run and given back as
    --deepspeed-config, it trains the same run; `for_engine` is what DeepSpeed is handed."""

    path: Path  # the file it came from
    batch: Batch
    values: MappingProxyType  # the whole config, read-only
    # The gradient norm the training loop clips to itself, in one foreach call, before DeepSpeed's step (0: none,
    # or DeepSpeed clips); the engine's copy has `gradient_clipping` 0 then. See `loop_clipping`.
    loop_clip: float = 0.0

    @property
    def weight_decay(self) -> float:
        return self.values.get("optimizer", {}).get("params", {}).get("weight_decay", 0.0)

    def as_dict(self) -> dict[str, Any]:
        """A deep copy, for the run's records."""
        return copy.deepcopy(dict(self.values))

    def for_engine(self) -> dict[str, Any]:
        """What DeepSpeed is built with (a copy: it may write into the dict it is given): the run's config, with
        DeepSpeed's own clipping off where the loop clips instead."""
        cfg = self.as_dict()
        if self.loop_clip:
            cfg["gradient_clipping"] = 0.0
        return cfg

    def text(self) -> str:
        return json.dumps(self.values, indent=2, default=dict)


@dataclass(frozen=True)
class Settings(_Sections):
    """A config file checked for this run, and everything the run decides on top of it but the schedule."""

    path: Path
    values: MappingProxyType  # the file's object with --learning-rate applied, read-only
    batch: Batch
    learning_rate: Optional[float]  # the optimizer's, after --learning-rate
    monitor_dir: Path  # where file monitors without an output_path write
    load_universal: bool = False  # the run resumes from DeepSpeed's universal checkpoint (resume.py decides)

    def resuming(self, batch: Batch, load_universal: bool) -> "Settings":
        """These settings for a resume that keeps a checkpoint's global batch with `batch`."""
        return replace(self, batch=batch, load_universal=load_universal)

    def finish(self, total_steps: int, warmup_ratio: float) -> DeepSpeedConfig:
        """The finished config of a run of `total_steps` optimizer steps."""
        cfg = copy.deepcopy(dict(self.values))
        cfg.update(
            train_micro_batch_size_per_gpu=self.batch.micro,
            train_batch_size=self.batch.size,
            gradient_accumulation_steps=self.batch.accumulation,
        )
        for section in FILE_MONITORS:
            if cfg.get(section, {}).get("enabled") and not cfg[section].get("output_path"):
                cfg[section]["output_path"] = str(self.monitor_dir)
        fills = {
            "total_num_steps": total_steps,
            "warmup_num_steps": max(math.ceil(total_steps * warmup_ratio), 1),  # DeepSpeed's schedulers refuse 0
            "warmup_max_lr": self.learning_rate,
        }
        params = cfg.get("scheduler", {}).get("params", {})
        params.update({key: value for key, value in fills.items() if params.get(key) == "auto"})
        if self.load_universal:
            cfg["checkpoint"] = dict(cfg.get("checkpoint", {}), load_universal=True)
        return DeepSpeedConfig(self.path, self.batch, MappingProxyType(cfg), loop_clipping(cfg))


def _positive_int(cfg: Mapping[str, Any], key: str, path: PathLike, default: Optional[int] = None) -> int:
    value = cfg.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise UserError(f"{path}: '{key}' must be a positive integer, not {value!r}")
    return value


def _batch(cfg: Mapping[str, Any], path: PathLike, world_size: int) -> Batch:
    """The batch from whichever of the three batch keys the config gives."""
    gas = _positive_int(cfg, "gradient_accumulation_steps", path, default=1)
    if "train_micro_batch_size_per_gpu" in cfg:
        micro = _positive_int(cfg, "train_micro_batch_size_per_gpu", path)
        if (
            "train_batch_size" in cfg
            and _positive_int(cfg, "train_batch_size", path) != Batch(micro, gas, world_size).size
        ):
            raise UserError(
                f"{path}: train_batch_size {cfg['train_batch_size']} != train_micro_batch_size_per_gpu {micro} "
                f"x gradient_accumulation_steps {gas} x world size {world_size}; remove train_batch_size "
                f"to derive it"
            )
        return Batch(micro, gas, world_size)
    total, per_sample = _positive_int(cfg, "train_batch_size", path), Batch(1, gas, world_size)
    if total % per_sample.size:
        raise UserError(
            f"{path}: train_batch_size {total} is not divisible by gradient_accumulation_steps "
            f"{gas} x world size {world_size}"
        )
    return Batch(total // per_sample.size, gas, world_size)


def _check_values(cfg: Mapping[str, Any], path: PathLike, has_gpu: bool) -> None:
    """Precision against this machine, the ZeRO stage and the learning rate."""
    chosen = [f"{s}.enabled" for s in (*HALF_SECTIONS, "torch_autocast") if cfg.get(s, {}).get("enabled")]
    if len(chosen) > 1:
        raise UserError(f"{path}: {' and '.join(chosen)} are each true; choose one")
    autocast = cfg.get("torch_autocast", {})
    if autocast.get("enabled"):
        from deepspeed.runtime.config import DtypeEnum  # heavy: not for launch and sweep

        try:
            dtype = DtypeEnum(autocast.get("dtype")).name
        except ValueError:
            dtype = None
        if dtype not in ("fp16", "bf16"):
            raise UserError(f"{path}: torch_autocast.dtype must be bfloat16 or float16, not {autocast.get('dtype')!r}")
    if cfg.get("fp16", {}).get("enabled") and not has_gpu:  # DeepSpeed's fp16 weights; fp16 autocast runs anywhere
        raise UserError(f"{path}: fp16.enabled needs a GPU and none is visible; on CPU use ds_fp32, ds_bf16 or ds_fp16")
    stage = cfg.get("zero_optimization", {}).get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise UserError(f"{path}: zero_optimization.stage must be 0..3, not {stage!r}")
    lr = cfg.get("optimizer", {}).get("params", {}).get("lr")
    if lr is not None and not (_is_number(lr) and 0 < lr < 1):
        raise UserError(f"{path}: optimizer.params.lr must be a number in (0, 1), not {lr!r}")
    clip = cfg.get("gradient_clipping", 0.0)
    if not (_is_number(clip) and math.isfinite(clip) and clip >= 0):  # the loop's clip_grad_norm_ takes any number
        raise UserError(f"{path}: gradient_clipping must be a norm of 0 or more (0: no clipping), not {clip!r}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_monitors(cfg: Mapping[str, Any], path: PathLike) -> None:
    """A monitor needs its package, which DeepSpeed would only miss at the first step."""
    for section, package in MONITOR_PACKAGES.items():
        if cfg.get(section, {}).get("enabled") and importlib.util.find_spec(package) is None:
            raise UserError(f"{path}: {section}.enabled needs the {package} package (pip install {package})")


def _check_with_deepspeed(cfg: Mapping[str, Any], path: PathLike) -> None:
    """DeepSpeed's own config model, one section at a time (so an error is named by the section it is in),
    then on the whole: unknown keys and bad values inside a section."""
    from deepspeed.runtime.config import DeepSpeedConfig, DeepSpeedConfigError  # heavy: not for launch and sweep
    from pydantic import ValidationError

    plain = {key: value for key, value in cfg.items() if not isinstance(value, dict)}
    for section in [*(key for key, value in cfg.items() if isinstance(value, dict)), None]:
        try:
            DeepSpeedConfig(cfg if section is None else {**plain, section: cfg[section]})
        except ValidationError as err:
            first = err.errors()[0]
            loc = [str(part) for part in first["loc"]]
            if section is not None and loc[:1] != [section]:  # a section's model names keys inside it
                loc.insert(0, section)
            what = "unknown key" if first["type"] == "extra_forbidden" else first["msg"].lower()
            raise UserError(f"{path}: {'.'.join(loc)}: {what}") from None
        except (DeepSpeedConfigError, AssertionError, ValueError, TypeError, KeyError, AttributeError) as err:
            raise UserError(f"{path}: {section or 'the config'}: DeepSpeed refuses it: {first_line(err)}") from None


# What DeepSpeed's engine pops from an Adam optimizer's params before it builds the optimizer (engine.py).
ADAM_ENGINE_KEYS = ("torch_adam", "adam_w_mode", "fp32_optimizer_states")
# torch.optim's switches (true, false, or null for its default): a truthy string would pass as true.
TORCH_SWITCHES = ("fused", "foreach", "amsgrad", "maximize", "capturable", "differentiable", "decoupled_weight_decay")


def _check_optimizer(cfg: Mapping[str, Any], path: PathLike) -> None:
    """The optimizer DeepSpeed's engine will build, built here on one parameter: its type must be one the
    engine knows and its params what that optimizer takes (the engine would fail on every rank, late)."""
    import torch  # heavy: not for launch and sweep
    from deepspeed.runtime.config import ADAGRAD_OPTIMIZER, ADAM_OPTIMIZER, ADAMW_OPTIMIZER, DEEPSPEED_OPTIMIZERS

    section = cfg.get("optimizer")
    if not section:
        return
    name, params = section.get("type"), dict(section.get("params", {}))
    cls: type
    known = isinstance(name, str) and (name.lower() in DEEPSPEED_OPTIMIZERS or _torch_class(torch.optim, name))
    if not known:
        raise UserError(
            f"{path}: optimizer.type {name!r} is not one DeepSpeed builds: one of "
            f"{', '.join(DEEPSPEED_OPTIMIZERS)}, or a torch.optim class such as AdamW or SGD"
        )
    betas = params.get("betas", [0.9, 0.999])
    if not (isinstance(betas, list) and len(betas) == 2 and all(isinstance(b, (int, float)) for b in betas)):
        raise UserError(f"{path}: optimizer.params.betas must be two numbers such as [0.9, 0.999], not {betas!r}")
    for key in ADAM_ENGINE_KEYS + TORCH_SWITCHES:  # a string such as "no" would be taken as true
        if key in params and not isinstance(params[key], bool) and params[key] is not None:
            raise UserError(f"{path}: optimizer.params.{key} must be true or false, not {params[key]!r}")
    if name.lower() in (ADAM_OPTIMIZER, ADAMW_OPTIMIZER):  # judged by torch's AdamW, which checks the same values
        cls, params = torch.optim.AdamW, {k: v for k, v in params.items() if k not in ADAM_ENGINE_KEYS}
        params.pop("bias_correction", None)  # DeepSpeed's fused and CPU Adam take it, torch's does not
    elif name.lower() == ADAGRAD_OPTIMIZER:
        cls = torch.optim.Adagrad
    elif name.lower() in DEEPSPEED_OPTIMIZERS:
        return  # DeepSpeed's own kernels (LAMB, Lion, Muon, mup): built only with the engine
    else:
        cls = getattr(torch.optim, name)  # a torch.optim class: `known` says so
    try:  # built and stepped once: the fused and foreach kernels check their arguments' types only then
        param = torch.nn.Parameter(torch.zeros(1))
        param.grad = torch.zeros(1)
        cls([param], **params).step()
    except (TypeError, ValueError, IndexError, KeyError, RuntimeError) as err:
        raise UserError(f"{path}: optimizer.params are not what {cls.__name__} takes: {first_line(err)}") from None


def _check_scheduler(cfg: Mapping[str, Any], path: PathLike, learning_rate: Optional[float]) -> None:
    """The scheduler DeepSpeed's engine will build, built here on a one-parameter optimizer, with its "auto"
    values given stand-ins (the run fills them from its length)."""
    import torch  # heavy: not for launch and sweep
    from deepspeed.runtime import lr_schedules

    section = cfg.get("scheduler")
    if not section:
        return
    name = section.get("type")
    cls = (
        getattr(lr_schedules, name)
        if name in lr_schedules.VALID_LR_SCHEDULES
        else _torch_class(torch.optim.lr_scheduler, name)
        if isinstance(name, str)
        else None
    )
    if cls is None:
        raise UserError(
            f"{path}: scheduler.type {name!r} is not one DeepSpeed recognises: one of "
            f"{', '.join(lr_schedules.VALID_LR_SCHEDULES)}, or a torch.optim.lr_scheduler class"
        )
    stand_ins = {"total_num_steps": 10, "warmup_num_steps": 1, "warmup_max_lr": learning_rate or 1e-3}
    params = {k: stand_ins.get(k, 1) if v == "auto" else v for k, v in section.get("params", {}).items()}
    quiet = logging.getLogger("DeepSpeed")  # its schedulers warn about being read before a first step
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        cls(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=learning_rate or 1e-3), **params)
    except (TypeError, ValueError, IndexError, KeyError, AssertionError) as err:
        raise UserError(f"{path}: scheduler.params are not what {name} takes: {first_line(err)}") from None
    finally:
        quiet.setLevel(level)


def _torch_class(module: ModuleType, name: str) -> Optional[type]:
    """The class `name` in one of torch's modules, or None: DeepSpeed falls back to those by name."""
    found = getattr(module, name, None)
    return found if isinstance(found, type) else None


def settings(
    raw: Mapping[str, Any],
    path: PathLike,
    *,
    world_size: int,
    has_gpu: bool,
    learning_rate: Optional[float] = None,
    micro_batch_size: Optional[int] = None,
    output_dir: PathLike = ".",
) -> Settings:
    """`raw` (from `load`) checked for this run, with its batch, learning rate and monitor directory decided."""
    for key in SECTIONS:
        if not isinstance(raw.get(key, {}), dict) or not isinstance(raw.get(key, {}).get("params", {}), dict):
            raise UserError(f"{path}: '{key}' and its 'params' must be JSON objects")
    cfg = json.loads(json.dumps(raw))  # a copy: `raw` stays as the file gave it
    if learning_rate is not None:
        cfg.setdefault("optimizer", {}).setdefault("params", {})["lr"] = learning_rate
    if micro_batch_size is not None:
        # The global batch follows from the new micro batch by the batch rule, not from the file's total.
        cfg.pop("train_batch_size", None)
        cfg["train_micro_batch_size_per_gpu"] = micro_batch_size
    batch = _batch(cfg, path, world_size)
    _check_values(cfg, path, has_gpu)
    # DeepSpeed would check train_batch_size for one process; _batch did, for this world size.
    _check_with_deepspeed(
        {
            **{k: v for k, v in cfg.items() if k != "train_batch_size"},
            "train_micro_batch_size_per_gpu": batch.micro,
            "gradient_accumulation_steps": batch.accumulation,
        },
        path,
    )
    _check_monitors(cfg, path)
    lr = cfg.get("optimizer", {}).get("params", {}).get("lr")
    _check_optimizer(cfg, path)
    _check_scheduler(cfg, path, lr)
    return Settings(Path(path), MappingProxyType(cfg), batch, lr, Path(output_dir) / "monitor")


def precision(cfg: Mapping[str, Any]) -> str:
    """What the model computes in: DeepSpeed's fp16 or bf16 weights, or torch autocast's dtype over fp32 weights."""
    for section in HALF_SECTIONS:
        if cfg.get(section, {}).get("enabled"):
            return section
    autocast = cfg.get("torch_autocast", {})
    if autocast.get("enabled"):
        from deepspeed.runtime.config import DtypeEnum  # DeepSpeed's own names of a dtype

        return DtypeEnum(autocast["dtype"]).name
    return "fp32"


def precision_path(cfg: Mapping[str, Any]) -> str:
    """How the model reaches its precision: DeepSpeed's 16-bit weights, stepped by its own optimizer wrapper, or
    torch autocast over fp32 weights, stepped by the optimizer itself. The two save different optimizer states,
    so a checkpoint of one does not resume in the other even where the precision's name is the same."""
    if any(cfg.get(s, {}).get("enabled") for s in HALF_SECTIONS):
        return f"{precision(cfg)} weights in DeepSpeed's 16-bit optimizer"
    if cfg.get("torch_autocast", {}).get("enabled"):
        return f"{precision(cfg)} autocast over fp32 weights"
    return "fp32 weights"


def loop_clipping(cfg: Mapping[str, Any]) -> float:
    """The gradient norm the training loop clips to itself, where DeepSpeed would clip the fp32 gradients one
    tensor at a time (`gradient_clipping` with neither a 16-bit section nor ZeRO, whose wrappers clip a flat
    buffer): about five aten ops a tensor, a thousand a step for BERT-base, where torch's foreach clipping
    dispatches a handful for the same norm."""
    plain = zero_stage(cfg) == 0 and not any(cfg.get(s, {}).get("enabled") for s in HALF_SECTIONS)
    return float(cfg.get("gradient_clipping", 0.0)) if plain else 0.0


def zero_stage(cfg: Mapping[str, Any]) -> int:
    return cfg.get("zero_optimization", {}).get("stage", 0)
