"""What a run writes into its --output-dir, the one test of whether it finished, and of whether a directory holds
a run at all.

`train_metrics.json` is written by rank 0 after the model is exported and the final evaluation (if any) is
written, and before the figure: its presence is what "this run finished" means, for `--resume`, sweeps and
summaries alike. A stopped run (exit 75) leaves checkpoints and no final metrics.

A run writes `deepspeed_config.json` first, before its first step. So a directory with any of `RUN_MARKS` holds a
run (finished, stopped or crashed) or a model exported into it, and a new training there is refused (`refuse_used`)
unless it continues the run (`--resume`) or replaces it (`--overwrite-output-dir`: `clear`). Any other directory,
empty or holding the user's own files, is an output dir like a new one.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from bert_squad.errors import UserError

TRAIN_METRICS = "train_metrics.json"
TRAINING_CURVES = "training_curves.png"  # the loss and dev F1 against the step, every part of a resumed run
DEEPSPEED_CONFIG = "deepspeed_config.json"  # the run's finished config: given back, the same run
EVAL_METRICS = "eval_metrics.json"
PREDICTIONS = "predictions.json"
NBEST = "nbest_predictions.json"
NULL_ODDS = "null_odds.json"
TASK_FILE = "bert_squad_task.json"  # beside an exported model's weights: what it was trained to do (task.py)
CHECKPOINTS = "checkpoints"  # checkpoint.py's
BEST = "best"  # the best step's exports while the run lasts (best.py)

# What says a run (or an export) is in a directory.
RUN_MARKS = (DEEPSPEED_CONFIG, CHECKPOINTS, BEST, TRAIN_METRICS, TASK_FILE)
# Everything else a run writes: its figure and evaluation, and the exported model (weights, config, tokenizer
# files by the names transformers gives them, the span head's modelling file), by name or pattern.
RUN_FILES = (TRAINING_CURVES, EVAL_METRICS, PREDICTIONS, NBEST, NULL_ODDS)
EXPORT_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model-*-of-*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "*.model",  # sentencepiece's (spm.model, sentencepiece.bpe.model)
    "modeling_*.py",
)


def finished(run_dir: str | Path) -> bool:
    return (Path(run_dir) / TRAIN_METRICS).is_file()


def marks(run_dir: str | Path) -> list[str]:
    """The `RUN_MARKS` in `run_dir`: empty where it holds no run (or does not exist)."""
    return [name for name in RUN_MARKS if (Path(run_dir) / name).exists()]


def refuse_used(run_dir: str | Path) -> None:
    """One line naming `run_dir` and the two ways on, where it holds a run: a second training there would
    overwrite its model and metrics and leave its checkpoints for a later --resume auto to take as its own."""
    found = marks(run_dir)
    if found:
        what = "a finished run" if TRAIN_METRICS in found else f"a run or a model ({', '.join(found)})"
        raise UserError(
            f"--output-dir {run_dir} holds {what}: continue it with --resume auto, or replace it with "
            f"--overwrite-output-dir (which removes its outputs and checkpoints first)"
        )


def clear(run_dir: str | Path) -> None:
    """Remove what a run wrote into `run_dir` (`--overwrite-output-dir`): its checkpoints and best-step exports,
    metrics, figure, evaluation and exported model; every other file of the directory stays. A directory that
    holds no run (no `RUN_MARKS`) is left as it is: its files are the user's."""
    run_dir = Path(run_dir)
    if not marks(run_dir):
        return
    for name in (CHECKPOINTS, BEST):
        shutil.rmtree(run_dir / name, ignore_errors=True)
    for pattern in (*RUN_MARKS, *RUN_FILES, *EXPORT_FILES):
        for path in run_dir.glob(pattern):
            if path.is_file() or path.is_symlink():
                path.unlink()
