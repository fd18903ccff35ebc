"""The DeepSpeed config: found by name or path, checked against this run before any work starts.

Batch rule: shipped configs give `train_micro_batch_size_per_gpu` and `gradient_accumulation_steps`;
the global `train_batch_size` is derived as micro x accumulation x world size. A config that also sets
`train_batch_size` must agree with that product for the current world size, or the run stops with an
error naming the keys. Scheduler values written "auto" are filled in from the run's length.
"""

import copy
import difflib
import functools
import importlib.util
import math
from collections.abc import KeysView
from pathlib import Path

from bert_squad.errors import UserError
from bert_squad.files import read_json

SHIPPED_DIR = Path(__file__).resolve().parent / "configs"  # package data: there in installed copies too

# Monitor sections DeepSpeed writes files for (an empty output_path means: relative to the working directory).
FILE_MONITORS = ("tensorboard", "csv_monitor")
MONITOR_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "comet": "comet_ml"}


class _Recording(dict):
    """A config dict that notes every top-level key looked up in it."""

    def __init__(self, items, seen):
        super().__init__(items)
        self.seen = seen

    def __copy__(self):
        return _Recording(self, self.seen)

    def __contains__(self, key):
        self.seen.add(key)
        return super().__contains__(key)

    def __getitem__(self, key):
        self.seen.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.seen.add(key)
        return super().get(key, default)

    def keys(self):
        return _RecordingKeys(self)


class _RecordingKeys(KeysView):
    def __contains__(self, key):
        return key in self._mapping


@functools.lru_cache(maxsize=None)
def deepspeed_keys():
    """The top-level keys DeepSpeed's config reads, noted while it parses a minimal config: the installed
    DeepSpeed is the judge, not a hand-kept list. (DeepSpeed itself ignores a key it does not read, so a
    misspelt one would silently change nothing.)"""
    from deepspeed.runtime.config import DeepSpeedConfig

    seen = set()
    DeepSpeedConfig(_Recording({"train_micro_batch_size_per_gpu": 1}, seen))
    return frozenset(seen)


def shipped_names():
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.json"))


def locate(name_or_path):
    """A config file: an existing path, else a shipped config by name (`ds_bf16` or `ds_bf16.json`)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    shipped = SHIPPED_DIR / (path.name if path.suffix == ".json" else path.name + ".json")
    if path.parent == Path(".") and shipped.is_file():
        return shipped
    raise UserError(f"{name_or_path}: no such DeepSpeed config (a JSON file, or one of "
                    f"{', '.join(shipped_names())})")


def load(name_or_path):
    path = locate(name_or_path)
    cfg = read_json(path, what="a DeepSpeed config")
    if not isinstance(cfg, dict):
        raise UserError(f"{path}: a DeepSpeed config is a JSON object")
    unknown = sorted(set(cfg) - deepspeed_keys())
    if unknown:
        close = difflib.get_close_matches(unknown[0], deepspeed_keys(), n=1)
        hint = f"did you mean '{close[0]}'?" if close else "see the DeepSpeed config documentation"
        raise UserError(f"{path}: unknown key '{unknown[0]}' ({hint})")
    return cfg


def _positive_int(cfg, key, path, default=None):
    value = cfg.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise UserError(f"{path}: '{key}' must be a positive integer, not {value!r}")
    return value


def _batch_sizes(cfg, path, world_size):
    """(micro, accumulation) from whichever of the three batch keys the config gives."""
    gas = _positive_int(cfg, "gradient_accumulation_steps", path, default=1)
    if "train_micro_batch_size_per_gpu" in cfg:
        micro = _positive_int(cfg, "train_micro_batch_size_per_gpu", path)
        if "train_batch_size" in cfg and _positive_int(cfg, "train_batch_size", path) != micro * gas * world_size:
            raise UserError(
                f"{path}: train_batch_size {cfg['train_batch_size']} != train_micro_batch_size_per_gpu {micro} "
                f"x gradient_accumulation_steps {gas} x world size {world_size}; remove train_batch_size "
                f"to derive it")
        return micro, gas
    total = _positive_int(cfg, "train_batch_size", path)
    if total % (gas * world_size):
        raise UserError(f"{path}: train_batch_size {total} is not divisible by gradient_accumulation_steps "
                        f"{gas} x world size {world_size}")
    return total // (gas * world_size), gas


def resolve(cfg, path, *, world_size, has_gpu, learning_rate=None):
    """Check the batch arithmetic and the precision against this machine; return a config to run."""
    cfg = copy.deepcopy(cfg)
    for key in ("fp16", "bf16", "zero_optimization", "optimizer", "scheduler"):  # the sections read here
        if not isinstance(cfg.get(key, {}), dict) or not isinstance(cfg.get(key, {}).get("params", {}), dict):
            raise UserError(f"{path}: '{key}' and its 'params' must be JSON objects")
    micro, gas = _batch_sizes(cfg, path, world_size)
    cfg.update(train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=gas,
               train_batch_size=micro * gas * world_size)
    if cfg.get("fp16", {}).get("enabled") and not has_gpu:
        raise UserError(f"{path}: fp16.enabled needs a GPU and none is visible; on CPU use "
                        f"ds_fp32 or ds_bf16")
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
    _check_with_deepspeed(cfg, path)
    return cfg


def _check_with_deepspeed(cfg, path):
    """DeepSpeed's own config model on the whole config: unknown keys and bad values inside a section."""
    from deepspeed.runtime.config import DeepSpeedConfig, DeepSpeedConfigError
    from pydantic import ValidationError

    # train_batch_size is left out: DeepSpeed would check it for one process; _batch_sizes did, for this world size.
    try:
        DeepSpeedConfig({k: v for k, v in cfg.items() if k != "train_batch_size"})
    except ValidationError as err:
        first = err.errors()[0]
        loc = [str(part) for part in first["loc"]]
        if loc and loc[0] not in cfg:  # a section's model reports keys relative to the section
            loc[:0] = [key for key, value in cfg.items() if isinstance(value, dict) and loc[0] in value][:1]
        what = "unknown key" if first["type"] == "extra_forbidden" else first["msg"].lower()
        raise UserError(f"{path}: {'.'.join(loc)}: {what}") from None
    except (DeepSpeedConfigError, AssertionError, ValueError, TypeError, KeyError, AttributeError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UserError(f"{path}: DeepSpeed refuses it: {reason}") from None


def place_monitors(cfg, path, output_dir):
    """Monitors need their package, and write into the run's output dir unless the config names a directory."""
    for section, package in MONITOR_PACKAGES.items():
        if cfg.get(section, {}).get("enabled") and importlib.util.find_spec(package) is None:
            raise UserError(f"{path}: {section}.enabled needs the {package} package (pip install {package})")
    for section in FILE_MONITORS:
        if cfg.get(section, {}).get("enabled") and not cfg[section].get("output_path"):
            cfg[section]["output_path"] = str(Path(output_dir) / "monitor")
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


def zero_stage(cfg):
    return cfg.get("zero_optimization", {}).get("stage", 0)
