"""A run's history across its parts: every log line, every evaluation, and the wall time of each part.

A run stopped (a time limit, preemption, Ctrl-C) and resumed, perhaps on another number of ranks, is one run in
parts. Each checkpoint carries the history so far (`history.json`, beside DeepSpeed's files and covered by the
checkpoint's digests); a resumed run continues it, so `train_metrics.json` and `training_curves.png` show the
whole run, as Hugging Face's Trainer keeps its `log_history` across a resume. A part's wall time counts from its
start to its last checkpoint (a part that ends without one left nothing to continue) or to the run's end.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FILE = "history.json"  # in a checkpoint


@dataclass
class Part:
    """One stretch of the run in one process group: from the step it started at to the last it saved or ended."""

    first_step: int
    last_step: int
    world_size: int
    wall_time_s: float = 0.0


@dataclass
class History:
    """The run's log lines and evaluations (each a dict with its `step`), and its parts; the same on every rank,
    but only rank 0's evaluations hold metrics."""

    logs: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    parts: list[Part] = field(default_factory=list)

    def start_part(self, step: int, world_size: int) -> None:
        """A new part, resumed at `step` (0 for a fresh run) on `world_size` ranks."""
        self.parts.append(Part(step, step, world_size))

    def reach(self, step: int, wall_time_s: float) -> None:
        """The current part has reached `step` after `wall_time_s` of its own."""
        self.parts[-1].last_step, self.parts[-1].wall_time_s = step, wall_time_s

    @property
    def wall_time_s(self) -> float:
        """The run's wall time: its parts' added up."""
        return sum(p.wall_time_s for p in self.parts)

    def took(self) -> str:
        """'412s', or '412s in 2 parts': the run's wall time as a log line says it."""
        parts = len(self.parts)
        return f"{self.wall_time_s:.0f}s" + (f" in {parts} parts" if parts > 1 else "")

    def as_dict(self) -> dict[str, Any]:
        return {"logs": self.logs, "evals": self.evals, "parts": [asdict(p) for p in self.parts]}

    def save(self, directory: str | Path) -> None:
        """Into a checkpoint (rank 0)."""
        (Path(directory) / FILE).write_text(json.dumps(self.as_dict()) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> History:
        """The history a checkpoint holds; an empty one where it has none (written before histories were kept)."""
        path = Path(directory) / FILE
        return cls.of(json.loads(path.read_text())) if path.is_file() else cls()

    @classmethod
    def of(cls, saved: dict[str, Any]) -> History:
        """The history in `as_dict`'s form (a checkpoint's file, train_metrics.json)."""
        return cls(saved["logs"], saved["evals"], [Part(**p) for p in saved["parts"]])

    @classmethod
    def resumed(cls, checkpoint_dir: str | Path, metrics_file: Path) -> History:
        """The history a run resumed from the checkpoint in `checkpoint_dir` continues. A run that finished at that
        checkpoint's step and is now taken further (a larger --max-steps) evaluated after saving it: its final
        metrics (`metrics_file`, train_metrics.json) hold that evaluation and the part's whole wall time, so their
        history is continued, where it is the checkpoint's with those added."""
        saved = cls.load(checkpoint_dir)
        if not (saved.parts and metrics_file.is_file()):
            return saved
        try:
            finished = cls.of(json.loads(metrics_file.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return saved  # a metrics file damaged or edited since: the checkpoint's own history is whole to its step
        same_run = finished.logs == saved.logs and len(finished.parts) == len(saved.parts)
        return finished if same_run and finished.parts[-1].last_step == saved.parts[-1].last_step else saved
