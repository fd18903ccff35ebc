"""Command-line entry: training is the default action; other actions are subcommands.

Every action raises `UserError` for bad input; this module turns it into one line on stderr and exit
code 2, so a batch log shows the cause, not a traceback (unless --debug).
"""

import importlib
import os
import sys
import traceback

from bert_squad.errors import UserError

# Subcommand -> module whose `main(argv) -> int` runs it. Anything else is training arguments.
SUBCOMMANDS = {
    "score": "bert_squad.score",
    "evaluate": "bert_squad.evaluate",
    "answer": "bert_squad.answer",
    "export": "bert_squad.export",
    "check-cache": "bert_squad.cache",
    "launch": "bert_squad.cluster.launch",
    "sweep": "bert_squad.cluster.sweep",
    "summarize": "bert_squad.cluster.summarize",
}


def run(action, argv, prog="bert-squad"):
    """Run `action(argv)`, mapping user errors to one stderr line and exit code 2."""
    debug = "--debug" in argv or os.environ.get("BERT_SQUAD_DEBUG") == "1"
    try:
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
    into every log and into job scripts rendered with --dry-run > file."""
    if "DS_ACCELERATOR" not in os.environ:
        import torch

        if not torch.cuda.is_available():  # true on ROCm builds too
            os.environ["DS_ACCELERATOR"] = "cpu"


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    pick_accelerator()
    if argv and argv[0] in SUBCOMMANDS:
        module = importlib.import_module(SUBCOMMANDS[argv[0]])
        return run(module.main, argv[1:], prog=f"bert-squad {argv[0]}")
    from bert_squad import train

    return run(train.main, argv)
