"""Command-line entry: training is the default action; other actions are subcommands.

Every action raises `UserError` for bad input; this module turns it into one line on stderr and exit
code 2, so a batch log shows the cause, not a traceback (unless --debug).
"""

import importlib
import os
import sys
import traceback

from bert_squad.errors import UserError, debug_requested

# Subcommand -> module whose `main(argv) -> int` runs it. Anything else is training arguments.
SUBCOMMANDS = {
    "score": "bert_squad.score",
    "evaluate": "bert_squad.evaluate",
    "answer": "bert_squad.answer",
    "check-cache": "bert_squad.cache",
    "launch": "bert_squad.cluster.launch",
    "sweep": "bert_squad.cluster.sweep",
    "summarize": "bert_squad.cluster.summarize",
}


def run(action, argv, prog="bert-squad"):
    """Run `action(argv)`, mapping user errors to one stderr line and exit code 2."""
    debug = "--debug" in argv
    try:
        debug = debug_requested() or debug
        pick_accelerator()
        return action(argv) or 0
    except UserError as err:
        if debug:
            traceback.print_exc()
        print(f"{prog}: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def pick_accelerator():
    """Without a GPU, tell DeepSpeed so: otherwise it prints its fallback warning on stdout at import,
    into every log and into job scripts rendered with --dry-run > file. One the user set must be DeepSpeed's."""
    if "DS_ACCELERATOR" in os.environ:
        try:
            import deepspeed  # noqa: F401  (its import picks the accelerator, and refuses an unknown one)
        except ValueError as err:
            raise UserError(f"DS_ACCELERATOR={os.environ['DS_ACCELERATOR']}: not an accelerator DeepSpeed knows "
                            f"({str(err).split('. Value')[0]})") from None
    else:
        import torch

        if not torch.cuda.is_available():  # true on ROCm builds too
            os.environ["DS_ACCELERATOR"] = "cpu"


def command(module):
    """The `main` of `module`, imported when it runs: inside `run`, after pick_accelerator has checked
    DS_ACCELERATOR, which DeepSpeed reads (and fails on) as soon as it is imported."""
    return lambda argv: importlib.import_module(module).main(argv)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        return run(command(SUBCOMMANDS[argv[0]]), argv[1:], prog=f"bert-squad {argv[0]}")
    return run(command("bert_squad.train"), argv)
