"""What a run chooses by its device where the user chose nothing: how a micro batch is padded and which shipped
DeepSpeed config (its precision) it trains in, each with the reason the plan line gives.

One rule each, in one place. Padding: fixed shapes (the length buckets) where the step is compiled (`--compile`,
on a GPU replayed as CUDA graphs: a graph a shape), the fewest computed tokens (each batch to its longest) on a
CPU, whose step time follows its tokens; a GPU without `--compile` keeps the buckets until a GPU measures both.
Precision: bf16 autocast over fp32 weights (`ds_bf16`) where the device computes bf16 natively and faster than
fp32: a GPU that torch says supports it; a CPU with AVX512-BF16 or AMX-BF16 (Arm: BF16) whose timed bf16 matmul
beats its fp32 one (the flags alone do not tell: an AMD EPYC with AVX512-BF16 trained 1.58x faster in bf16, an
Intel Xeon with it and no AMX 0.57x). fp32 (`ds_fp32`) elsewhere; fp16 is never chosen (it needs a loss scaler,
and most CPUs emulate it). A run that resumes a checkpoint keeps the precision the checkpoint was written in. What
the user gives (`--padding`, `--deepspeed-config`, `--bf16`, `--fp16`) always wins.

The CPU's features come from /proc/cpuinfo's text and its bf16 speed from a function (`perf.bf16_speedup`), both
arguments here, so every branch can be checked on any machine. Nothing here imports a library.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BF16, FP32, FP16 = "ds_bf16", "ds_fp32", "ds_fp16"  # the shipped configs a default or a Trainer flag names
# What a CPU needs to compute in 16 bits natively, by its /proc/cpuinfo line: x86's "flags", Arm's "Features".
NATIVE: dict[str, dict[str, tuple[str, ...]]] = {
    "bf16": {"flags": ("avx512_bf16", "amx_bf16"), "Features": ("bf16",)},
    "fp16": {"flags": ("avx512_fp16", "amx_fp16"), "Features": ("fphp", "asimdhp")},
}
# fp16 autocast where the CPU has no fp16 arithmetic, against fp32: the demo's sample, 6 steps (docs/performance.md).
FP16_EMULATED_COST = "about 17x slower than fp32 (docs/performance.md)"


@dataclass(frozen=True)
class Choice:
    """A value the run takes and why, in the plan line's words."""

    value: str
    why: str


def padding(given: str | None, compiled: bool, device_type: str) -> Choice:
    """What each training micro batch is padded to (config.PADDINGS' names)."""
    if given:
        return Choice(given, "given")
    if compiled:
        return Choice("buckets", "--compile builds a graph a shape")
    if device_type == "cpu":
        return Choice("longest", "the fewest tokens, which a CPU's step time follows")
    return Choice("buckets", "a GPU's default until measured against 'longest'")


def cpu_features(cpuinfo: str) -> set[str]:
    """The feature words of /proc/cpuinfo's first "flags" (x86) or "Features" (Arm) line."""
    found = re.search(r"^(?:flags|Features)\s*:(.*)$", cpuinfo, re.M)
    return set(found.group(1).split()) if found else set()


def cpu_computes(dtype: str, cpuinfo: str) -> bool:
    """Whether a CPU whose /proc/cpuinfo says `cpuinfo` computes `dtype` ("bf16", "fp16") natively."""
    words = {word for line in NATIVE[dtype].values() for word in line}
    return bool(words & cpu_features(cpuinfo))


def this_cpuinfo() -> str:
    """This machine's /proc/cpuinfo (empty where there is none: no native 16-bit arithmetic assumed)."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _native(dtype: str, cpuinfo: str) -> str:
    """The features that make a CPU compute `dtype` natively, as the plan line names them."""
    return ", ".join(sorted({w for line in NATIVE[dtype].values() for w in line} & cpu_features(cpuinfo)))


def precision(
    named: str | None,
    device_type: str,
    gpu_bf16: bool,
    cpuinfo: str,
    bf16_speedup: Callable[[], float],
    resumed: str | None = None,
) -> Choice:
    """The DeepSpeed config a run trains in: the one named (a name or file), else the shipped config of the
    precision a resumed checkpoint was written in (`resumed`: its marker's "fp32", "bf16" or "fp16"; a config
    other than these three was named, and resume.py refuses a checkpoint of it with the config to name), else the
    device's: `ds_bf16` where it computes bf16 natively and faster (`gpu_bf16`: torch's word for a GPU; for a
    CPU, `cpuinfo`'s features, then `bf16_speedup()`: bf16's speed over fp32's, timed only here), else
    `ds_fp32`."""
    if named:
        return Choice(named, "given")
    if resumed is not None:
        kept = {"bf16": BF16, "fp16": FP16}.get(resumed, FP32)
        return Choice(kept, "kept from the checkpoint it resumes")
    if device_type != "cpu":
        return Choice(BF16, "this GPU computes bf16") if gpu_bf16 else Choice(FP32, "this GPU has no bf16")
    if not cpu_computes("bf16", cpuinfo):
        return Choice(FP32, "this CPU has no bf16 arithmetic (no avx512_bf16, amx_bf16 or Arm bf16)")
    speedup, native = bf16_speedup(), _native("bf16", cpuinfo)
    if speedup > 1:
        return Choice(BF16, f"this CPU computes bf16 ({native}), {speedup:.2f}x fp32's speed in a timed matmul")
    return Choice(FP32, f"this CPU computes bf16 ({native}) but at {speedup:.2f}x fp32's speed in a timed matmul")


def cost(precision: str, device_type: str, cpuinfo: str) -> str:
    """What a run's precision costs on its device where it is emulated (empty where it is not): fp16 autocast on
    a CPU without fp16 arithmetic."""
    if precision == "fp16" and device_type == "cpu" and not cpu_computes("fp16", cpuinfo):
        return f"fp16 is emulated on this CPU (no avx512_fp16 or amx_fp16): {FP16_EMULATED_COST}"
    return ""
