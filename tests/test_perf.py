"""The FLOP accounting behind MFU and the table of peak FLOP/s it divides by."""

from bert_squad.perf import flops_per_sample, model_shape, peak_tflops


def test_bert_base_flops_per_sample_at_384():
    from transformers import BertConfig, BertForQuestionAnswering

    gflop = flops_per_sample(model_shape(BertForQuestionAnswering(BertConfig())), 384) / 1e9
    assert 205 < gflop < 220  # the published figure: about 212 GFLOP per 384-token sample


def test_peak_table():
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989
    assert peak_tflops("NVIDIA H100 PCIe", "bf16") == 756
    assert peak_tflops("AMD Instinct MI250X", "fp16") == 191.5
    assert peak_tflops("cpu", "fp32") is None and peak_tflops("cpu", "fp32", override=1.5) == 1.5


class Clock:
    """A clock the test moves by hand: the meter's seconds are the test's, not the machine's."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_rates_count_training_not_an_evaluation_or_checkpoint_in_the_window():
    """A window of 2 steps of 16 samples, 1 s each, with a 30 s evaluation and a 5 s checkpoint between them: its
    line reads 16 samples/s (32 in 2 s of training), not 32 / 37; the next window, with none, reads its own; the
    run's rate counts the 3 training seconds only."""
    import torch

    from bert_squad.perf import Meter

    clock = Clock()
    meter = Meter((1000, 2, 8), world_size=1, peak=None, clock=clock)
    batch = {"input_ids": torch.zeros(16, 8, dtype=torch.long), "attention_mask": torch.ones(16, 8, dtype=torch.long)}

    def step(seconds):
        clock.now += seconds
        meter.add(batch, torch.tensor(2.0))

    step(1.0)
    with meter.paused():
        clock.now += 30.0  # an evaluation
    step(1.0)
    with meter.paused():
        clock.now += 5.0  # a checkpoint
    first = meter.log_rates()
    assert first["samples_per_second"] == 16.0 and first["tokens_per_second"] == 128.0 and first["loss"] == 2.0
    step(0.5)
    assert meter.log_rates()["samples_per_second"] == 32.0
    assert meter.run_rates()["samples_per_second"] == 48 / 2.5
    # An error inside the pause leaves it out all the same (a failed evaluation ends the run anyway).
    try:
        with meter.paused():
            clock.now += 7.0
            raise RuntimeError
    except RuntimeError:
        pass
    assert meter.run_rates()["samples_per_second"] == 48 / 2.5


def test_a_command_keeps_few_onednn_kernels_unless_told_otherwise():
    """oneDNN keeps the kernels (and buffers) of every shape it met, 1,024 by default; a command's process keeps 16
    (docs/measurements/2026-12-cpu-defaults.md), set before torch loads; a value in the environment wins."""
    import os
    import subprocess
    import sys

    name = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
    show = f"import os; from bert_squad import runtime; runtime.prepare(); print(os.environ['{name}'])"
    env = {k: v for k, v in os.environ.items() if k != name}
    for given, kept in ((None, "16"), ("256", "256")):
        run_env = env if given is None else {**env, name: given}
        done = subprocess.run(
            [sys.executable, "-c", show], capture_output=True, text=True, env=run_env, check=True, timeout=120
        )
        assert done.stdout.strip() == kept
