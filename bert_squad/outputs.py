"""What a run writes into its --output-dir, and the one test of whether it finished.

`train_metrics.json` is written last, by rank 0, after the model is exported and the final
evaluation (if any) is written: its presence is what "this run finished" means, for `--resume`,
sweeps and summaries alike. A stopped run (exit 75) leaves checkpoints and no final metrics.
"""

import os
from pathlib import Path

from bert_squad.errors import UserError

TRAIN_METRICS = "train_metrics.json"
EVAL_METRICS = "eval_metrics.json"
PREDICTIONS = "predictions.json"
NBEST = "nbest_predictions.json"
NULL_ODDS = "null_odds.json"


def finished(run_dir):
    return (Path(run_dir) / TRAIN_METRICS).is_file()


def check_output_dir(path):
    """Fail before training, not after hours of it, when the output dir cannot be written (also run by
    `check-cache`, inside the job's container, before the ranks start)."""
    probe = Path(path) / f".write-test-{os.getpid()}"
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise UserError(f"{path}: output dir cannot be written ({err.strerror})") from None
