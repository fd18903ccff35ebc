"""Stopping on request: Slurm's end-of-job warning (SIGUSR1) or preemption and scancel (SIGTERM).

The handler only records the signal; the training loop asks every rank at steps all ranks know alike
(`distributed.StopCheck`: the log steps, and about every 10 s of training between), so all ranks
stop at the same step, save one checkpoint and exit with EXIT_STOPPED. The handlers are this module's only
while a `StopRequest` is entered: on the way out the previous ones are back.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any

EXIT_STOPPED = 75  # stopped after saving a checkpoint: resume with --resume auto to continue


class StopRequest:
    SIGNALS = (signal.SIGUSR1, signal.SIGTERM)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def __enter__(self) -> StopRequest:
        self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum

    @property
    def requested(self) -> bool:
        return self.signum is not None
