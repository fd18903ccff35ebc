"""Files in and out: a JSON file read with one clear error line; atomic writes, so a reader (or a
crash) sees the old file or the new one, never half of one."""

import json
import os
from pathlib import Path

from bert_squad.errors import UserError


def read_text(path, what="a text file"):
    """The file's UTF-8 text, or a UserError that names the file and what is wrong with it."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, not {what}") from None
    except OSError as err:
        raise UserError(f"{path}: cannot read: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None


def read_json(path, what="a JSON file"):
    """The parsed file, or a UserError that names the file and what is wrong with it."""
    text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"{path}: malformed JSON at line {err.lineno} column {err.colno}: {err.msg}") from None


def write_text_atomic(path, text):
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as err:  # a directory in the way, no such parent, no permission: nothing left behind
        tmp.unlink(missing_ok=True)
        raise UserError(f"{path}: cannot be written ({err.strerror or err})") from None


def write_json_atomic(path, obj, indent=2):
    write_text_atomic(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")


def not_a_file(path, what="directory"):
    """A directory option may name a directory or nothing yet, never a file."""
    if Path(path).exists() and not Path(path).is_dir():
        raise UserError(f"{path}: {what} is a file, not a directory")


def ensure_writable_dir(path, what="directory"):
    """Create `path` if needed and prove it can be written, so a run fails before its work, not after."""
    path = Path(path)
    not_a_file(path, what)
    probe = path / f".write-test-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise UserError(f"{path}: {what} cannot be written ({err.strerror})") from None
