"""Stopping on request: Slurm's end-of-job warning (SIGUSR1) or preemption and scancel (SIGTERM).

The handler only records the signal; the training loop asks every rank at each step, so all ranks
stop at the same step, save one checkpoint and exit with EXIT_STOPPED.
"""

import signal

EXIT_STOPPED = 75  # stopped after saving a checkpoint: resume with --resume auto to continue


class StopRequest:
    SIGNALS = (signal.SIGUSR1, signal.SIGTERM)

    def __init__(self):
        self.signum = None
        for sig in self.SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        self.signum = signum

    @property
    def requested(self):
        return self.signum is not None
