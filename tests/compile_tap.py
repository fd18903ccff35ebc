"""`bert-squad` training as the --compile tests need it: inductor draws its random numbers as eager code does
(`fallback_random`: a compiled run's dropout masks are an eager run's), and from the second epoch on a recompile
is an error (torch.compiler's "fail_on_recompile" stance): every length bucket of the first epoch has had its
first step by then.

    python tests/compile_tap.py <bert-squad training arguments>

The real training runs; nothing is replaced.
"""

import sys

import torch._inductor.config

from bert_squad import cli, train

_optimizer_steps = train.optimizer_steps


def optimizer_steps(run):
    for micro_batches in _optimizer_steps(run):
        if run.progress.step == run.work.steps_per_epoch + 1:  # the second epoch's first step
            torch.compiler.set_stance("fail_on_recompile")
        yield micro_batches


if __name__ == "__main__":
    torch._inductor.config.fallback_random = True
    train.optimizer_steps = optimizer_steps
    sys.exit(cli.main(sys.argv[1:]))
