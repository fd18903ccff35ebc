"""What a run writes into its --output-dir, and the one test of whether it finished.

`train_metrics.json` is written last, by rank 0, after the model is exported and the final
evaluation (if any) is written: its presence is what "this run finished" means, for `--resume`,
sweeps and summaries alike. A stopped run (exit 75) leaves checkpoints and no final metrics.
"""

from __future__ import annotations

from pathlib import Path

TRAIN_METRICS = "train_metrics.json"
TRAINING_CURVES = "training_curves.png"  # the loss and dev F1 against the step, every part of a resumed run
DEEPSPEED_CONFIG = "deepspeed_config.json"  # the run's finished config: given back, the same run
EVAL_METRICS = "eval_metrics.json"
PREDICTIONS = "predictions.json"
NBEST = "nbest_predictions.json"
NULL_ODDS = "null_odds.json"
TASK_FILE = "bert_squad_task.json"  # beside an exported model's weights: what it was trained to do (task.py)


def finished(run_dir: str | Path) -> bool:
    return (Path(run_dir) / TRAIN_METRICS).is_file()
