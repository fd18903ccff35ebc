"""Throughput accounting: samples/s, non-padding tokens/s, model TFLOP/s and MFU per device.

Model FLOPs per sample of length s (forward + backward) = 6 * N * s + 12 * L * H * s^2, with N the
non-embedding parameters (the matmul weights) and the second term the attention scores and values.
For BERT-base at s = 384 that is about 212 GFLOP. s is the length the device computed (the padded
batch length); non-padding tokens/s is reported beside it to show the useful part.
"""

from __future__ import annotations

import contextlib
import resource
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Optional

import torch

# (non-embedding parameters, layers, hidden size): layers and hidden size None where a config names them otherwise
Shape = tuple[int, Optional[int], Optional[int]]
Reduce = Callable[[list[float]], list[float]]
Rates = dict[str, Optional[float]]  # samples/s, tokens/s, TFLOP/s per device, MFU, mean loss (None: not known)

# Dense tensor-core peak TFLOP/s per device for 16-bit math, for plain fp32 (PyTorch's default for fp32 matrix
# products) and for TF32 (--tf32), from NVIDIA's and AMD's data sheets.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989, "fp16": 989, "fp32": 67, "tf32": 494.7},
    "H100 PCIe": {"bf16": 756, "fp16": 756, "fp32": 51, "tf32": 378},
    "H100": {"bf16": 989, "fp16": 989, "fp32": 67, "tf32": 494.7},
    "A100": {"bf16": 312, "fp16": 312, "fp32": 19.5, "tf32": 156},
    "V100": {"fp16": 125, "fp32": 15.7},
    "P100": {"fp16": 18.7, "fp32": 9.3},
    "MI250X": {"bf16": 191.5, "fp16": 191.5, "fp32": 47.9},  # per GCD, which is what one rank drives
    "MI300X": {"bf16": 1307, "fp16": 1307, "fp32": 163},
    "MI100": {"bf16": 92.3, "fp16": 184.6, "fp32": 23.1},
}


def peak_tflops(device_name: str, precision: str, override: float | None = None) -> float | None:
    if override:
        return override
    for key, table in PEAK_TFLOPS.items():  # "H100 PCIe" is listed before "H100" on purpose
        if key.lower() in device_name.lower():
            return table.get(precision)
    return None


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


def model_shape(module: torch.nn.Module) -> Shape:
    """(non-embedding parameters, layers, hidden size) of a transformers model.

    Parameters are counted, not derived from config fields, so every family (GLU feed-forwards,
    DeBERTa's relative-position projections) is right; layers and hidden size give attention's
    sequence-squared term, and are None where a config names them differently (that term is left out)."""

    def count(params: Iterable[torch.nn.Parameter]) -> int:  # ZeRO-3 leaves each rank a shard; ds_numel is the whole's
        return sum(getattr(p, "ds_numel", p.numel()) for p in params)

    embedding = count(p for m in module.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters())
    n = count(module.parameters()) - embedding
    config = module.config
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layers", None)
    h = getattr(config, "hidden_size", None) or getattr(config, "dim", None)
    return n, layers, h


def flops_per_sample(shape: Shape, seq_len: int) -> int:
    """Forward and backward: 6 FLOPs per parameter per token, plus attention's scores and mixing."""
    n, layers, h = shape
    return 6 * n * seq_len + (12 * layers * h * seq_len * seq_len if layers and h else 0)


def bf16_speedup(tokens: int = 512, hidden: int = 768, inner: int = 3072, repeats: int = 2) -> float:
    """How many times faster this CPU trains a BERT-base feed-forward matmul (forward and backward, `tokens` rows)
    under bf16 autocast over fp32 weights, as `ds_bf16` trains, than in fp32; the best of `repeats` each, after
    one call that lets oneDNN build its kernels. Under a second on one core; on the Intel Xeon measured the ratio
    held from 384 to 1024 wide and 512 to 2048 rows (docs/measurements/2026-12-cpu-defaults.md)."""
    x = torch.randn(tokens, hidden, requires_grad=True)
    w = torch.randn(inner, hidden, requires_grad=True)

    def best(bf16: bool) -> float:
        times = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
                out = torch.nn.functional.linear(x, w)
            out.float().sum().backward()
            times.append(time.perf_counter() - start)
        return min(times[1:])

    return best(False) / best(True)


class Meter:
    """Work and loss since the last log line, and since the start of the run, over the time spent training:
    an evaluation or a checkpoint in between (`paused`) is not in the rates, whose log lines give its own time.

    The loss is summed on the device and read only when a line is logged: no host sync per step. `clock` is
    where the seconds come from (time.perf_counter; a test's own).
    """

    KEYS = ("samples", "tokens", "flops", "loss", "micro_batches")

    def __init__(
        self, shape: Shape, world_size: int, peak: float | None, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.shape, self.world_size, self.peak, self.clock = shape, world_size, peak, clock
        self.started = self.t0 = clock()
        self.window = dict.fromkeys(self.KEYS, 0)
        self.total = dict.fromkeys(self.KEYS, 0)
        self.paused_window = self.paused_total = 0.0  # seconds not training, since the last line and the start
        self.shapes: set[tuple[int, int]] = set()  # (rows, tokens) of the micro batches: a compiled graph each

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The body's time (an evaluation, a checkpoint) left out of the training rates."""
        start = self.clock()
        try:
            yield
        finally:
            seconds = self.clock() - start
            self.paused_window += seconds
            self.paused_total += seconds

    def add(self, batch: dict[str, torch.Tensor], loss: torch.Tensor | None = None) -> None:
        """Count a micro batch (its host copy, before it moves to the device) and its loss. The host copy's
        tokens are summed by numpy: no torch op, so nothing in the step that reads a tensor back."""
        n, s = batch["input_ids"].shape
        self.shapes.add((n, s))
        counts = {
            "samples": n,
            "tokens": int(batch["attention_mask"].numpy().sum()),
            "flops": n * flops_per_sample(self.shape, s),
            "micro_batches": 1,
            "loss": 0 if loss is None else loss.detach().float(),
        }
        for counter in (self.window, self.total):
            for key, value in counts.items():
                counter[key] = counter[key] + value

    def _rates(self, counts: dict[str, Any], seconds: float, reduce: Reduce) -> Rates:
        loss = counts["loss"]
        values = [counts["samples"], counts["tokens"], counts["flops"], float(loss), counts["micro_batches"]]
        samples, tokens, flops, loss_sum, batches = reduce(values)
        dt = max(seconds, 1e-9)
        tflops = flops / dt / 1e12 / self.world_size
        return {
            "samples_per_second": samples / dt,
            "tokens_per_second": tokens / dt,
            "tflops_per_device": tflops,
            "mfu": tflops / self.peak if self.peak else None,
            "loss": loss_sum / batches if batches else None,
        }

    def log_rates(self, reduce: Reduce = lambda xs: xs) -> Rates:
        """Rates and mean loss over all ranks (`reduce` sums across ranks) since the last call."""
        now = self.clock()
        rates = self._rates(self.window, now - self.t0 - self.paused_window, reduce)
        self.t0, self.window, self.paused_window = now, dict.fromkeys(self.KEYS, 0), 0.0
        return rates

    def run_rates(self, reduce: Reduce = lambda xs: xs) -> Rates:
        """The same since the start of the run."""
        return self._rates(self.total, self.clock() - self.started - self.paused_total, reduce)


def peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB
