"""The DeepSpeed config of a run, built once as a finished value by the rules this module owns.

`settings` reads a config (a shipped name or a JSON file), checks it against this machine and world size,
and decides everything that does not depend on the run's length: the batch, the learning rate, where file
monitors write and, on resume, how the checkpoint's global batch is kept. `Settings.finish` fills the
schedule from the run's length and returns the `DeepSpeedConfig` the engine is built with; nothing edits
it afterwards, and the run writes it beside its metrics.

Batch rule: shipped configs give `train_micro_batch_size_per_gpu` and `gradient_accumulation_steps`;
the global `train_batch_size` is derived as micro x accumulation x world size. A config that also sets
`train_batch_size` must agree with that product for the current world size, or the run stops with an
error naming the keys. Scheduler values written "auto" are filled in from the run's length and lr.

Resume rule (`resume_plan`): a checkpoint written by another world size keeps its global batch, by gradient
accumulation (its micro batch stays the config's). ZeRO stage 0 keeps the whole optimizer state in one file
every rank loads, so it resumes as it is; ZeRO 1-3 split it by rank, so it resumes through DeepSpeed's
universal checkpoint (`universal` converts it once; the finished config sets `checkpoint.load_universal`).
A world that cannot keep the batch, another stage or precision than the checkpoint's, or an optimizer
offloaded to NVMe (DeepSpeed loads no universal checkpoint then) is refused in one line.
"""

import difflib
import functools
import importlib.util
import json
import math
from collections.abc import KeysView
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from bert_squad.errors import UserError
from bert_squad.files import read_json

SHIPPED_DIR = Path(__file__).resolve().parent / "configs"  # package data: there in installed copies too

# Monitor sections DeepSpeed writes files for (an empty output_path means: relative to the working directory).
FILE_MONITORS = ("tensorboard", "csv_monitor")
MONITOR_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "comet": "comet_ml"}
# The sections read here, which must be objects with object params.
SECTIONS = ("fp16", "bf16", "zero_optimization", "optimizer", "scheduler")


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
    from deepspeed.runtime.config import DeepSpeedConfig  # heavy: not for launch and sweep

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
    """The config file's top-level object; keys DeepSpeed does not read are refused, with a suggestion."""
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


@dataclass(frozen=True)
class Batch:
    """Micro batch per rank x gradient accumulation x ranks: the global batch of one optimizer step."""

    micro: int
    accumulation: int
    world_size: int

    @property
    def size(self):
        return self.micro * self.accumulation * self.world_size


# How a checkpoint resumes: in the world it was written in; its whole optimizer state in another world, the
# batch kept by accumulation; its ZeRO shards through a universal checkpoint, likewise.
AS_IS, ACCUMULATE, UNIVERSAL = "as is", "accumulate", "universal"


@dataclass(frozen=True)
class Resume:
    """How the checkpoint a run continues resumes in its world, and with which batch."""

    action: str  # AS_IS, ACCUMULATE or UNIVERSAL
    batch: Batch


@dataclass(frozen=True)
class DeepSpeedConfig:
    """The config the engine is built with, finished: what it holds cannot change."""

    path: Path  # the file it came from
    batch: Batch
    precision: str  # fp32, fp16 or bf16
    zero_stage: int
    text: str  # the whole config as JSON

    def as_dict(self):
        """A fresh dict of it, for DeepSpeed and for the run's records."""
        return json.loads(self.text)


@dataclass(frozen=True)
class Settings:
    """A config file checked for this run, and everything the run decides on top of it but the schedule."""

    path: Path
    checked: str  # the file's object with --learning-rate applied, as JSON
    batch: Batch
    learning_rate: Optional[float]  # the optimizer's, after --learning-rate
    monitor_dir: Path  # where file monitors without an output_path write
    resume: Optional[Resume] = None  # how the checkpoint the run continues resumes (its batch is `batch`)

    def finish(self, total_steps, warmup_ratio):
        """The finished config of a run of `total_steps` optimizer steps."""
        cfg = json.loads(self.checked)
        cfg.update(train_micro_batch_size_per_gpu=self.batch.micro, train_batch_size=self.batch.size,
                   gradient_accumulation_steps=self.batch.accumulation)
        for section in FILE_MONITORS:
            if cfg.get(section, {}).get("enabled") and not cfg[section].get("output_path"):
                cfg[section]["output_path"] = str(self.monitor_dir)
        fills = {"total_num_steps": total_steps, "warmup_num_steps": math.ceil(total_steps * warmup_ratio),
                 "warmup_max_lr": self.learning_rate}
        params = cfg.get("scheduler", {}).get("params", {})
        params.update({key: value for key, value in fills.items() if params.get(key) == "auto"})
        if self.resume is not None and self.resume.action == UNIVERSAL:
            cfg["checkpoint"] = dict(cfg.get("checkpoint", {}), load_universal=True)
        return DeepSpeedConfig(self.path, self.batch, precision(cfg), zero_stage(cfg), json.dumps(cfg, indent=2))


def _positive_int(cfg, key, path, default=None):
    value = cfg.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise UserError(f"{path}: '{key}' must be a positive integer, not {value!r}")
    return value


def _batch(cfg, path, world_size):
    """The batch from whichever of the three batch keys the config gives."""
    gas = _positive_int(cfg, "gradient_accumulation_steps", path, default=1)
    if "train_micro_batch_size_per_gpu" in cfg:
        micro = _positive_int(cfg, "train_micro_batch_size_per_gpu", path)
        if "train_batch_size" in cfg and _positive_int(cfg, "train_batch_size", path) != micro * gas * world_size:
            raise UserError(
                f"{path}: train_batch_size {cfg['train_batch_size']} != train_micro_batch_size_per_gpu {micro} "
                f"x gradient_accumulation_steps {gas} x world size {world_size}; remove train_batch_size "
                f"to derive it")
        return Batch(micro, gas, world_size)
    total = _positive_int(cfg, "train_batch_size", path)
    if total % (gas * world_size):
        raise UserError(f"{path}: train_batch_size {total} is not divisible by gradient_accumulation_steps "
                        f"{gas} x world size {world_size}")
    return Batch(total // (gas * world_size), gas, world_size)


def _check_values(cfg, path, has_gpu):
    """Precision against this machine, the ZeRO stage and the learning rate."""
    if cfg.get("fp16", {}).get("enabled") and not has_gpu:
        raise UserError(f"{path}: fp16.enabled needs a GPU and none is visible; on CPU use "
                        f"ds_fp32 or ds_bf16")
    if cfg.get("fp16", {}).get("enabled") and cfg.get("bf16", {}).get("enabled"):
        raise UserError(f"{path}: fp16.enabled and bf16.enabled are both true; choose one")
    stage = cfg.get("zero_optimization", {}).get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise UserError(f"{path}: zero_optimization.stage must be 0..3, not {stage!r}")
    lr = cfg.get("optimizer", {}).get("params", {}).get("lr")
    if lr is not None and not (isinstance(lr, (int, float)) and 0 < lr < 1):
        raise UserError(f"{path}: optimizer.params.lr must be a number in (0, 1), not {lr!r}")


def _check_monitors(cfg, path):
    """A monitor needs its package, which DeepSpeed would only miss at the first step."""
    for section, package in MONITOR_PACKAGES.items():
        if cfg.get(section, {}).get("enabled") and importlib.util.find_spec(package) is None:
            raise UserError(f"{path}: {section}.enabled needs the {package} package (pip install {package})")


def _check_with_deepspeed(cfg, path):
    """DeepSpeed's own config model on the whole config: unknown keys and bad values inside a section."""
    from deepspeed.runtime.config import DeepSpeedConfig, DeepSpeedConfigError  # heavy: not for launch and sweep
    from pydantic import ValidationError

    try:
        DeepSpeedConfig(cfg)
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


def resume_plan(layout, batch, cfg, path):
    """How checkpoint `path`, written as `layout` (a `checkpoint.Layout`), resumes with `batch` and the
    config `cfg`; a UserError naming both sides where it cannot."""
    stage, bits = zero_stage(cfg), precision(cfg)
    if (layout.zero_stage, layout.precision) not in ((None, None), (stage, bits)):
        raise UserError(f"{path}: written with ZeRO stage {layout.zero_stage} in {layout.precision}, this run's "
                        f"DeepSpeed config has stage {stage} in {bits}; resume with the config it was written with")
    if layout.world_size in (None, batch.world_size):
        return Resume(AS_IS, batch)
    old, new = ranks(layout.world_size), ranks(batch.world_size)
    if layout.train_batch_size % (batch.micro * batch.world_size):
        raise UserError(f"{path}: written by {old} with a global batch of {layout.train_batch_size}, which {new} x "
                        f"micro batch {batch.micro} cannot keep by accumulation; resume on {old}, or on a number "
                        f"of ranks that divides {layout.train_batch_size // batch.micro}")
    if layout.sharded and cfg.get("zero_optimization", {}).get("offload_optimizer", {}).get("device") == "nvme":
        raise UserError(f"{path}: written by {old}, this run has {batch.world_size}; DeepSpeed loads no universal "
                        f"checkpoint with the optimizer offloaded to NVMe (engine.load_checkpoint skips it); "
                        f"resume on {old}")
    kept = replace(batch, accumulation=layout.train_batch_size // (batch.micro * batch.world_size))
    return Resume(UNIVERSAL if layout.sharded else ACCUMULATE, kept)


def ranks(n):
    """'1 rank', '4 ranks': how messages count ranks."""
    return f"{n} rank" if n == 1 else f"{n} ranks"


def settings(raw, path, *, world_size, has_gpu, learning_rate=None, output_dir=".", resumed=None):
    """`raw` (from `load`) checked for this run, with its batch, learning rate and monitor directory decided;
    `resumed` is the `checkpoint.Found` the run continues, if any."""
    for key in SECTIONS:
        if not isinstance(raw.get(key, {}), dict) or not isinstance(raw.get(key, {}).get("params", {}), dict):
            raise UserError(f"{path}: '{key}' and its 'params' must be JSON objects")
    cfg = json.loads(json.dumps(raw))  # a copy: `raw` stays as the file gave it
    if learning_rate is not None:
        cfg.setdefault("optimizer", {}).setdefault("params", {})["lr"] = learning_rate
    batch = _batch(cfg, path, world_size)
    _check_values(cfg, path, has_gpu)
    # DeepSpeed would check train_batch_size for one process; _batch did, for this world size.
    _check_with_deepspeed({**{k: v for k, v in cfg.items() if k != "train_batch_size"},
                           "train_micro_batch_size_per_gpu": batch.micro,
                           "gradient_accumulation_steps": batch.accumulation}, path)
    _check_monitors(cfg, path)
    resume = resume_plan(resumed.layout, batch, cfg, resumed.path) if resumed is not None else None
    lr = cfg.get("optimizer", {}).get("params", {}).get("lr")
    return Settings(Path(path), json.dumps(cfg), resume.batch if resume else batch, lr, Path(output_dir) / "monitor",
                    resume)


def precision(cfg):
    if cfg.get("fp16", {}).get("enabled"):
        return "fp16"
    if cfg.get("bf16", {}).get("enabled"):
        return "bf16"
    return "fp32"


def zero_stage(cfg):
    return cfg.get("zero_optimization", {}).get("stage", 0)
