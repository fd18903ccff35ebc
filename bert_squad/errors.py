"""The one exception type users see, and how a command turns it into a single error line and exit code 2."""

import os
import sys
import traceback
from collections.abc import Sequence
from typing import Callable, Optional

EXIT_USAGE = 2
DEBUG_FLAG = "--debug"  # every command's (config.ArgumentParser adds it); read here before any parsing


class UserError(Exception):
    """Bad input or environment: the message names the file, field, id or key at fault."""

    exit_code = EXIT_USAGE


def first_line(err: BaseException) -> str:
    """A library's error in one line, enough to say what is wrong without a traceback: the first non-empty line
    of its message, stripped, or its type's name where the message is empty."""
    return next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)


def debug_requested(args: Sequence[str] = (), strict: bool = True) -> bool:
    """--debug among a command's `args`, or BERT_SQUAD_DEBUG=1: tracebacks and DeepSpeed's info logging. Any
    other value than 0 or 1 is refused rather than silently read as 0 (`strict=False`: read as 0, for the
    error path that reports it)."""
    value = os.environ.get("BERT_SQUAD_DEBUG", "0")
    if strict and value not in ("0", "1"):
        raise UserError(f"BERT_SQUAD_DEBUG={value}: use 1 (tracebacks and DeepSpeed's info logging) or 0")
    return DEBUG_FLAG in args or value == "1"


def exit_code(action: Callable[[], Optional[int]], prog: str, debug: bool = False) -> int:
    """Run `action()`: its return value (None: 0), or one stderr line and the exit code of a UserError, so a
    batch log shows the cause, not a traceback (unless `debug`)."""
    try:
        return action() or 0
    except UserError as err:
        if debug:
            traceback.print_exc()
        print(f"{prog}: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
