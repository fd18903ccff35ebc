"""`bert-squad` training with the project's own cross-rank reductions counted, for tests of the stop check.

    python tests/reduce_tap.py OUT_JSON [--signal-at-step N] <bert-squad training arguments>

Every call of `distributed._reduce` (the all-reduce that stop checks, log lines and the run's totals go
through) is recorded with the optimizer step it was made at; each rank writes the list to
OUT_JSON.rank<R> on its way out. With --signal-at-step N, rank 0 sends itself SIGUSR1 once step N has
trained, as Slurm's end-of-job warning would; the other ranks get no signal and must learn of it. The
real training runs; nothing is replaced.
"""

import json
import os
import signal
import sys

from bert_squad import cli, distributed, train

CALLS = []  # the optimizer step of each reduction, in order
STEP = [0]
_reduce, _optimizer_steps = distributed._reduce, train.optimizer_steps


def reduce(values, op):
    CALLS.append(STEP[0])
    return _reduce(values, op)


def optimizer_steps(run):
    for micro_batches in _optimizer_steps(run):
        STEP[0] = run.progress.step
        yield micro_batches  # the loop trains, logs and checks this step before asking for the next
        if run.progress.step == SIGNAL_AT and run.inputs.dist.is_main:
            os.kill(os.getpid(), signal.SIGUSR1)


if __name__ == "__main__":
    out, args = sys.argv[1], sys.argv[2:]
    SIGNAL_AT = int(args[1]) if args[:1] == ["--signal-at-step"] else None
    args = args[2:] if SIGNAL_AT is not None else args
    distributed._reduce, train.optimizer_steps = reduce, optimizer_steps
    try:
        code = cli.main(args)
    finally:
        with open(f"{out}.rank{os.environ.get('RANK', '0')}", "w") as f:
            json.dump(CALLS, f)
    sys.exit(code)
