"""Command-line entry: training is the default command; the others are subcommands.

Each command names its parser and its action: the parser runs first, imported alone (so `--help` and argument
errors come before torch, DeepSpeed or transformers load), then the process-wide set-up the command needs
(`runtime.prepare`), then the action. A `UserError`
from any of them is one line on stderr and exit code 2, so a batch log shows the cause, not a traceback
(unless --debug).
"""

import importlib
import os
import sys
from dataclasses import dataclass

from bert_squad import runtime
from bert_squad.errors import debug_requested, exit_code


@dataclass(frozen=True)
class Command:
    """A command: its parser and its action ("module:function" each), and the process set-up it needs."""

    parse: str  # argv -> options; argparse exits here for --help
    run: str  # options -> exit code
    deepspeed: bool = False  # starts DeepSpeed (its process group or engine)
    offline: bool = True  # the Hugging Face libraries never try the network


TRAINING_ARGS = "bert_squad.config:parse_run_config"
# Command words -> Command. The longest match of the first words wins; anything else is training.
COMMANDS = {
    "train": Command(TRAINING_ARGS, "bert_squad.train:main", deepspeed=True),
    "config": Command(TRAINING_ARGS, "bert_squad.train:print_config", deepspeed=True),
    "download": Command(TRAINING_ARGS, "bert_squad.download:download", offline=False),
    "check-cache": Command("bert_squad.download:parse_check", "bert_squad.download:check_cache"),
    "evaluate": Command("bert_squad.evaluate:parse", "bert_squad.evaluate:run", deepspeed=True),
    "export": Command("bert_squad.export:parse", "bert_squad.export:run"),
    "answer": Command("bert_squad.answer:parse", "bert_squad.answer:run"),
    "test": Command("bert_squad.bert_squad_test:parse", "bert_squad.bert_squad_test:run"),
    "score": Command("bert_squad.score:parse", "bert_squad.score:run"),
    "launch": Command("bert_squad.cluster.launch:parse", "bert_squad.cluster.launch:run"),
    "sweep": Command("bert_squad.cluster.sweep:parse", "bert_squad.cluster.sweep:submit"),
    "sweep run": Command("bert_squad.cluster.sweep:parse_task", "bert_squad.cluster.sweep:run_task", deepspeed=True),
    "summarize": Command("bert_squad.cluster.summarize:parse", "bert_squad.cluster.summarize:run"),
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


def load(spec):
    """The function a "module:function" spec names, its module imported now."""
    module, function = spec.split(":")
    return getattr(importlib.import_module(module), function)


def run(name, args, prog):
    """Run command `name` on `args`; its exit code."""
    command = COMMANDS[name]
    debug = "--debug" in args or os.environ.get("BERT_SQUAD_DEBUG") == "1"  # for the traceback; checked below

    def parse_prepare_run():
        options = load(command.parse)(args)
        runtime.prepare(offline=command.offline, deepspeed=command.deepspeed, debug=debug or debug_requested())
        return load(command.run)(options)

    return exit_code(parse_prepare_run, prog, debug)


def main(argv=None):
    name, args, words = split_command(list(sys.argv[1:] if argv is None else argv))
    return run(name, args, " ".join(["bert-squad", words]).strip())


def bert_squad_test(argv=None):
    """The `bert-squad-test` console script, the same as `bert-squad test`."""
    return run("test", list(sys.argv[1:] if argv is None else argv), "bert-squad-test")
