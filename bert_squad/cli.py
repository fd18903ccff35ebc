"""Command-line entry: training is the default command; the others are subcommands.

Each command names its parser and its action: the parser runs first, imported alone (so `--help` and argument
errors come before torch, DeepSpeed or transformers load), then the process-wide set-up the command needs
(`runtime.prepare`), then its check of the inputs that need no library (a missing file is one line before any
loads), then DeepSpeed's set-up where the command starts it, then the action. A `UserError`
from any of them is one line on stderr and exit code 2, so a batch log shows the cause, not a traceback
(unless --debug).
"""

import difflib
import importlib
import sys
from typing import Any, Callable, Optional

from bert_squad import runtime
from bert_squad.commands import ALIASES, COMMANDS, listed
from bert_squad.errors import UserError, debug_requested, exit_code


def split_command(argv: list[str]) -> tuple[str, list[str], str]:
    """(command, the command's arguments, the words that named it: none for training and its aliases). A first
    word that is no option and names no command is refused: training takes options only."""
    for alias, name in ALIASES.items():
        if alias in argv and not (argv and argv[0] in COMMANDS):
            return name, [a for a in argv if a != alias], ""
    for words in sorted(COMMANDS, key=len, reverse=True):
        n = len(words.split())
        if argv[:n] == words.split():
            return words, argv[n:], words
    if argv and not argv[0].startswith("-"):
        close = difflib.get_close_matches(argv[0], listed(), n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"the commands: {', '.join(listed())}"
        raise UserError(f"unknown command '{argv[0]}' ({hint}); training takes options only (bert-squad --help)")
    return "train", argv, ""


def load(spec: str) -> Callable[..., Any]:
    """The function a "module:function" spec names, its module imported now."""
    module, function = spec.split(":")
    return getattr(importlib.import_module(module), function)


def run(name: str, args: list[str], prog: str) -> int:
    """Run command `name` on `args`; its exit code."""
    command = COMMANDS[name]

    def parse_prepare_run() -> Optional[int]:
        options, debug = load(command.parse)(args), debug_requested(args)
        runtime.prepare(offline=command.offline, debug=debug)
        if command.check:
            load(command.check)(options)
        if command.deepspeed:
            runtime.prepare_deepspeed(debug)
        return load(command.run)(options)

    return exit_code(parse_prepare_run, prog, debug_requested(args, strict=False))


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)

    def split_and_run() -> int:
        name, args, words = split_command(argv)
        return run(name, args, " ".join(["bert-squad", words]).strip())

    return exit_code(split_and_run, "bert-squad", debug_requested(argv, strict=False))


def bert_squad_test(argv: Optional[list[str]] = None) -> int:
    """The `bert-squad-test` console script, the same as `bert-squad test`."""
    return run("test", list(sys.argv[1:] if argv is None else argv), "bert-squad-test")
