"""Stopping on request: Slurm's end-of-job warning (SIGUSR1), preemption and scancel (SIGTERM), and Ctrl-C
(SIGINT) where a person trains at a terminal or under salloc.

The handler only records the signal, and does no I/O (a print inside a signal handler can land in the middle
of another write of the same stream, which Python refuses as a "reentrant call"): the training loop says that
the stop is on its way (`first_seen`), and asks every rank at steps all ranks know alike
(`distributed.StopCheck`: the log steps, and about every 10 s of training between), so all ranks
stop at the same step, save one checkpoint and exit with EXIT_STOPPED. After the first Ctrl-C a second one
ends the process at once, by SIGINT's own default action, whatever it is doing: a checkpoint it was saving is
left without its `complete` marker, so no resume takes it. The handlers are this module's only while a
`StopRequest` is entered (the training loop): on the way out the previous ones are back, and a Ctrl-C
elsewhere (building, evaluating, exporting) ends the command with exit 130 as before.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any

EXIT_STOPPED = 75  # stopped after saving a checkpoint: resume with --resume auto to continue


class StopRequest:
    SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._told = False  # the loop has said that a stop is on its way
        self._previous: dict[signal.Signals, Any] = {}

    def __enter__(self) -> StopRequest:
        self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        """Records the signal, nothing more (no I/O: see the module's docstring)."""
        self.signum = signum
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # a second Ctrl-C aborts at once

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def first_seen(self) -> int | None:
        """The signal, at the first look after one arrived (None at every other): when the loop says the stop is
        on its way."""
        if self._told or self.signum is None:
            return None
        self._told = True
        return self.signum
