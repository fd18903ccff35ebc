"""Command-line entry: training is the default command; the others are subcommands.

Each command is a `runtime.Command` in its module: `parse` runs first (so `--help` and argument errors are
instant), then the process-wide set-up the command needs (`runtime.prepare`), then `run`. A `UserError`
from any of them is one line on stderr and exit code 2, so a batch log shows the cause, not a traceback
(unless --debug).
"""

import importlib
import os
import sys

from bert_squad import runtime
from bert_squad.errors import exit_code

# Command words -> "module:Command". The longest match of the first words wins; anything else is training.
COMMANDS = {
    "train": "bert_squad.train:TRAIN",
    "config": "bert_squad.train:PRINT_CONFIG",
    "download": "bert_squad.download:DOWNLOAD",
    "check-cache": "bert_squad.download:CHECK_CACHE",
    "evaluate": "bert_squad.evaluate:EVALUATE",
    "answer": "bert_squad.answer:ANSWER",
    "test": "bert_squad.bert_squad_test:TEST",
    "score": "bert_squad.score:SCORE",
    "launch": "bert_squad.cluster.launch:LAUNCH",
    "sweep": "bert_squad.cluster.sweep:SUBMIT",
    "sweep run": "bert_squad.cluster.sweep:RUN_TASK",
    "summarize": "bert_squad.cluster.summarize:SUMMARIZE",
}
# Training flags that run another command on the same arguments, as the README and job scripts spell them.
ALIASES = {"--download-only": "download", "--print-config": "config"}


def split_command(argv):
    """(command, the command's arguments, the words that named it: none for training and its aliases)."""
    for alias, name in ALIASES.items():
        if alias in argv and not (argv and argv[0] in COMMANDS):
            return name, [a for a in argv if a != alias], ""
    for words in sorted(COMMANDS, key=len, reverse=True):
        n = len(words.split())
        if argv[:n] == words.split():
            return words, argv[n:], words
    return "train", argv, ""


def load(name):
    module, attr = COMMANDS[name].split(":")
    return getattr(importlib.import_module(module), attr)


def run(name, args, prog):
    """Run command `name` on `args`; its exit code."""
    debug = "--debug" in args or os.environ.get("BERT_SQUAD_DEBUG") == "1"
    command = load(name)

    def parse_prepare_run():
        options = command.parse(args)
        runtime.prepare(offline=command.offline, deepspeed=command.deepspeed, debug=debug)
        return command.run(options)

    return exit_code(parse_prepare_run, prog, debug)


def main(argv=None):
    name, args, words = split_command(list(sys.argv[1:] if argv is None else argv))
    return run(name, args, " ".join(["bert-squad", words]).strip())


def bert_squad_test(argv=None):
    """The `bert-squad-test` console script, the same as `bert-squad test`."""
    return run("test", list(sys.argv[1:] if argv is None else argv), "bert-squad-test")
