#!/usr/bin/env python
"""Hugging Face's `Trainer` set up as transformers' examples/pytorch/question-answering/run_qa.py sets it up,
on the model and data the project's rows use: the peer that bench/gpu_check.py measures in the same call, so
every project row can say how it compares.

    python bench/hf_trainer.py --model DIR --train-file F --out DIR [--max-seq-length 384] [--steps 400]

What run_qa.py does that sets its speed, done the same way here: every feature padded to --max-seq-length when
it is built and batches stacked by `default_data_collator`; `TrainingArguments` with bf16 autocast over fp32
weights where the device has bf16 (fp32 else), torch's fused AdamW (`adamw_torch_fused`), 2 data loader
workers with pinned memory, batch 16, lr 5e-5 with linear decay, seed 42, no checkpoints and no reports. The
features are the project's own (`bert_squad.features.build_features`, which labels windows as run_qa.py does),
so both sides train the same 384-token windows with stride 128.

OUT/train_metrics.json has the keys of the project's that gpu_check reads: `logs` (one per logging window,
timed where the Trainer logs, after it has read the loss from the device), `engine`, `precision`, `device`,
`train_batch_size`, `peak_memory_gib`. Tokens/s are samples/s times the mean non-padding tokens of a feature
(the Trainer is not asked to count them: that would read the device every step); TFLOP/s and MFU count the
padded length, as the project's do.

With `--epochs` it trains the project's accuracy recipe instead, for the accuracy table's Trainer rows
(bench/accuracy.sh with TRAINER=1) and bench/vs_trainer.py: --epochs (or --max-steps), --learning-rate, --seed
and the dropout rates as the project's run takes them, linear warmup over --warmup-ratio of the steps then
linear decay, weight decay 0.01 (not on biases and LayerNorm), gradient norm clipped to 1, each batch padded to
its longest and grouped by length (`train_sampling_strategy="group_by_length"`), and the Trainer's `bf16=True`
(bf16 autocast over fp32 weights) where the device computes bf16 natively and faster than fp32, by the project's
own rule and timing (`bert_squad.choices`, `bert_squad.perf.bf16_speedup`): the Trainer at its best for the
machine; then the saved model is evaluated by the project's `evaluate` on --eval-file (the same post-processing
and official-rule scorer), into OUT/eval.
"""

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

BATCH, WORKERS, LR, SEED = 16, 2, 5e-5, 42  # run_qa.py's command: docs/measurements/2026-11-h100-first-calls.md
INPUTS = ("input_ids", "token_type_ids", "attention_mask")


def padded_features(model: Path, train_file: Path, seq: int, fixed: bool = True) -> tuple:
    """(the train features as a datasets.Dataset, padded to `seq` tokens where `fixed`, its mean non-padding
    tokens a feature, the tokenizer, whether the file is SQuAD v2.0)."""
    import datasets  # heavy: after the arguments are read
    from datasets.table import InMemoryTable
    from transformers import AutoTokenizer

    from bert_squad.config import WindowConfig
    from bert_squad.data import read_squad
    from bert_squad.features import build_features

    tokenizer = AutoTokenizer.from_pretrained(model)
    examples = read_squad(train_file)
    built = build_features(examples, tokenizer, WindowConfig(max_seq_length=seq), None, train=True)
    columns = {name: built[name] for name in INPUTS if name in built.column_names}
    padded = tokenizer.pad(columns, padding="max_length", max_length=seq) if fixed else columns
    table = {name: padded[name] for name in columns}
    table.update(start_positions=built["start_positions"], end_positions=built["end_positions"])
    tokens = sum(map(sum, columns["attention_mask"])) / len(built)
    # Its own fingerprint, as the project gives its features: datasets would otherwise hash the table with dill
    name = f"hf-trainer-{seq}-{'fixed' if fixed else 'per-batch'}"
    return datasets.Dataset(InMemoryTable.from_pydict(table), fingerprint=name), tokens, tokenizer, examples.version_2


class CountingCollator:
    """A collator that also counts the real (not padding) tokens of the batches it makes, on their host copy: the
    recipe's tokens/s, as the project's log lines count them (its batches are collated in the training process)."""

    def __init__(self, collate: Any) -> None:
        self.collate, self.tokens = collate, 0

    def __call__(self, rows: list) -> Any:
        batch = self.collate(rows)
        self.tokens += int(batch["attention_mask"].numpy().sum())
        return batch


def windows_callback(per_sample: dict, peak: Any, counted: Any = None) -> Any:
    """A TrainerCallback that records each logging window's rates the way the project's log lines give them;
    tokens/s from a `CountingCollator`'s count where given (samples/s times `per_sample["tokens"]` else)."""
    from transformers import TrainerCallback  # heavy: after the arguments are read

    class Windows(TrainerCallback):
        def __init__(self) -> None:
            self.logs: list = []

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.since, self.step, self.tokens = time.perf_counter(), 0, counted.tokens if counted else 0

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if not logs or "loss" not in logs:  # the summary at the end of training
                return
            now = time.perf_counter()
            rate = (state.global_step - self.step) * BATCH / (now - self.since)
            tokens = (counted.tokens - self.tokens) / (now - self.since) if counted else rate * per_sample["tokens"]
            tflops = rate * per_sample["flops"] / 1e12
            self.logs.append(
                dict(
                    step=state.global_step,
                    loss=logs["loss"],
                    samples_per_second=rate,
                    tokens_per_second=tokens,
                    tflops_per_device=tflops,
                    mfu=tflops / peak if peak else None,
                )
            )
            self.since, self.step, self.tokens = now, state.global_step, counted.tokens if counted else 0

    return Windows()


def training_arguments(args: argparse.Namespace, bf16: bool, cpu: bool) -> Any:
    """run_qa.py's arguments, or with --epochs the project's accuracy recipe (the module's docstring)."""
    from transformers import TrainingArguments  # heavy: after the arguments are read

    common = dict(
        output_dir=str(args.out / "trainer"),
        per_device_train_batch_size=BATCH,
        logging_steps=args.log_every,
        save_strategy="no",
        report_to="none",
        use_cpu=cpu,  # the Trainer takes bf16 on a CPU only when told it is one
        optim="adamw_torch_fused",
    )
    if args.epochs:
        recipe = dict(learning_rate=args.learning_rate, num_train_epochs=args.epochs, seed=args.seed, bf16=bf16)
        recipe.update(warmup_steps=args.warmup_ratio, weight_decay=0.01, max_grad_norm=1.0)  # a float: a share
        recipe.update(train_sampling_strategy="group_by_length", max_steps=args.max_steps or -1)  # transformers 5's
        return TrainingArguments(**common, **recipe)  # batches collated in the training process (the CPU's)
    return TrainingArguments(
        **common,
        learning_rate=LR,
        max_steps=args.steps,
        seed=SEED,
        bf16=bf16,
        dataloader_num_workers=WORKERS,
        dataloader_pin_memory=True,
    )


def engine_facts(trainer: Any, bf16: bool) -> dict:
    """The optimizer the Trainer built and Accelerate's wrapper around it, in the project's engine terms."""
    wrapper = trainer.optimizer
    inner = getattr(wrapper, "optimizer", wrapper)
    return {
        "optimizer": f"{type(inner).__module__}.{type(inner).__qualname__}",
        "optimizer_wrapper": None if inner is wrapper else type(wrapper).__name__,
        "fused": bool(inner.defaults.get("fused")),
        "autocast": "bfloat16" if bf16 else None,
        "skipped_steps": 0,
    }


def train(args: argparse.Namespace) -> dict:
    """The Trainer's run: what train_metrics.json records of it."""
    import torch  # heavy: after the arguments are read
    import transformers
    from transformers import DataCollatorWithPadding, Trainer, default_data_collator
    from transformers.utils import is_torch_bf16_available_on_device

    from bert_squad import choices, perf
    from bert_squad import model as qa_model

    recipe = bool(args.epochs)
    dataset, tokens, tokenizer, version_2 = padded_features(
        args.model, args.train_file, args.max_seq_length, fixed=not recipe
    )
    transformers.set_seed(args.seed if recipe else SEED)  # the span head starts as the project's run of that seed
    model = qa_model.load_qa_model(args.model, dropout=args.dropout, attention_dropout=args.attention_dropout)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    bf16 = is_torch_bf16_available_on_device(device.type)  # run_qa.py's rule; the recipe's is the project's
    if recipe and device.type == "cpu":
        bf16 = choices.precision(None, "cpu", False, choices.this_cpuinfo(), perf.bf16_speedup).value == choices.BF16
    name = perf.device_name(device)
    per_sample = {"flops": perf.flops_per_sample(perf.model_shape(model), args.max_seq_length), "tokens": tokens}
    collate = CountingCollator(DataCollatorWithPadding(tokenizer)) if recipe else None
    windows = windows_callback(per_sample, perf.peak_tflops(name, "bf16" if bf16 else "fp32"), collate)
    trainer = Trainer(
        model=model,
        args=training_arguments(args, bf16, device.type == "cpu"),
        train_dataset=dataset,
        data_collator=collate or default_data_collator,
        processing_class=tokenizer,
        callbacks=[windows],
    )
    speed = trainer.train().metrics["train_samples_per_second"]  # over the Trainer's whole training loop
    if recipe:
        # What it was trained on, where the project's commands read a model's no-answer mode (task.recorded_mode)
        model.config.version_2_with_negative = version_2
        trainer.save_model(str(args.out / "model"))  # the weights, config and tokenizer, for `evaluate`
    return {
        "steps": trainer.state.global_step,
        "train_batch_size": BATCH,
        "precision": "bf16" if bf16 else "fp32",
        "engine": engine_facts(trainer, bf16),
        "device": name,
        "logs": windows.logs,
        "run_samples_per_second": speed,
        "peak_memory_gib": perf.peak_memory_gib(device),
        "features": len(dataset),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, type=Path, help="a model folder (config, weights, tokenizer)")
    p.add_argument("--train-file", required=True, type=Path, help="a SQuAD JSON file")
    p.add_argument("--out", required=True, type=Path, help="where train_metrics.json goes")
    p.add_argument("--max-seq-length", type=int, default=384)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--log-every", type=int, default=100)
    recipe = p.add_argument_group("the accuracy recipe (bench/accuracy.sh --trainer), instead of --steps")
    recipe.add_argument("--epochs", type=float, default=0.0, help="train this many epochs of the recipe")
    recipe.add_argument("--max-steps", type=int, default=0, help="train this many steps of it (0: --epochs decide)")
    recipe.add_argument("--learning-rate", type=float, default=1e-4)
    recipe.add_argument("--warmup-ratio", type=float, default=0.1)
    recipe.add_argument("--seed", type=int, default=SEED)
    recipe.add_argument("--dropout", type=float, default=None, help="as the project's --dropout")
    recipe.add_argument("--attention-dropout", type=float, default=None, help="as the project's --attention-dropout")
    recipe.add_argument("--eval-file", type=Path, help="evaluate the trained model on it with the project's evaluate")
    args = p.parse_args()
    if not (args.model / "config.json").is_file():
        sys.exit(f"hf_trainer: {args.model} is no model folder (no config.json)")
    if not 0 < args.log_every <= args.steps:
        sys.exit(f"hf_trainer: --log-every {args.log_every} must be from 1 to --steps ({args.steps})")
    from bert_squad.errors import UserError  # the project's one-line errors (a bad data file, a bad length)

    try:
        metrics = train(args)
    except UserError as e:
        sys.exit(f"hf_trainer: {e}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "train_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(f"hf_trainer: {len(metrics['logs'])} windows, metrics in {args.out / 'train_metrics.json'}")
    if args.epochs and args.eval_file:
        return evaluate(args)
    return 0


def evaluate(args: argparse.Namespace) -> int:
    """The trained model through the project's `evaluate` (its post-processing and scorer), into OUT/eval."""
    import subprocess

    cmd = [sys.executable, "-m", "bert_squad", "evaluate", "--model-dir", str(args.out / "model")]
    cmd += ["--eval-file", str(args.eval_file), "--output-dir", str(args.out / "eval")]
    cmd += ["--max-seq-length", str(args.max_seq_length)]  # the default stride, as the training features have
    return subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1]).returncode


if __name__ == "__main__":
    sys.exit(main())
