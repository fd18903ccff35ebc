"""The best evaluation so far (`--keep-best`, `--early-stopping`): which step had the best dev F1, and how
many evaluations since have not beaten it.

Rank 0 scores; its verdict is broadcast, so every rank holds the same record and takes the same collective
steps (the export under ZeRO-3 gathers the parameters from all of them). Each new best is exported at once,
with its predictions, to `<output-dir>/best/step<N>/`; at the end its files replace the final step's in
`<output-dir>`. The record travels in every checkpoint as `best.json`, so a resumed run remembers it.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bert_squad import distributed, outputs

FILE = "best.json"  # in a checkpoint


@dataclass
class Best:
    """The best evaluation so far; the same on every rank (metrics: rank 0's only)."""

    step: int | None = None
    metrics: dict[str, Any] | None = None
    evaluations_since: int = 0  # evaluations since the best that did not beat it
    last_evaluated: int | None = None  # the step of the latest evaluation
    checkpointed: int | None = None  # the best step when the latest checkpoint was saved: its export stays

    def judge(self, step: int, metrics: dict[str, Any] | None) -> bool:
        """Record the evaluation of `step` (`metrics` on rank 0, None elsewhere); True on every rank when it
        has a better F1 than the best so far (a tie keeps the earlier step)."""
        better = metrics is not None and (self.metrics is None or metrics["f1"] > self.metrics["f1"])
        better = distributed.broadcast_from_rank0(better)
        self.last_evaluated = step
        if better:
            self.step, self.metrics, self.evaluations_since = step, metrics, 0
        else:
            self.evaluations_since += 1
        return better

    def exhausted(self, patience: int) -> bool:
        """`patience` evaluations (--early-stopping; 0: never) without a better F1."""
        return bool(patience) and self.evaluations_since >= patience

    def save(self, directory: str | Path) -> None:
        """Into a checkpoint (rank 0): from now on a resumed run may need this best step's export."""
        self.checkpointed = self.step
        (Path(directory) / FILE).write_text(json.dumps(asdict(self)) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> Best:
        """The record a checkpoint holds; a fresh one where it has none (written without --keep-best)."""
        path = Path(directory) / FILE
        return cls(**json.loads(path.read_text())) if path.is_file() else cls()


def exports_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / outputs.BEST


def export_dir(output_dir: str | Path, step: int) -> Path:
    return exports_dir(output_dir) / f"step{step:08d}"


def pending_dir(output_dir: str | Path) -> Path:
    """Where an evaluation writes its predictions before it is known to be the best (rank 0)."""
    return exports_dir(output_dir) / ".pending"


def start_pending(output_dir: str | Path) -> Path:
    """An empty `pending_dir` for the next evaluation."""
    path = pending_dir(output_dir)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def promote(output_dir: str | Path, step: int) -> None:
    """The pending evaluation (with its exported model) becomes the export of `step`, in one rename."""
    target = export_dir(output_dir, step)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(pending_dir(output_dir), target)


def prune(output_dir: str | Path, record: Best) -> None:
    """Delete the exports no longer needed: all but the best's and the one the latest checkpoint records."""
    keep = {export_dir(output_dir, s) for s in (record.step, record.checkpointed) if s is not None}
    for path in exports_dir(output_dir).glob("step*"):
        if path not in keep:
            shutil.rmtree(path, ignore_errors=True)


def install(output_dir: str | Path, step: int) -> bool:
    """The best step's model and prediction files replace the final step's in `output_dir`; the exports go.
    False where its export is gone (a run resumed from an older checkpoint than the newest)."""
    source = export_dir(output_dir, step)
    if not source.is_dir():
        return False
    for f in source.iterdir():
        os.replace(f, Path(output_dir) / f.name)
    shutil.rmtree(exports_dir(output_dir), ignore_errors=True)
    return True
