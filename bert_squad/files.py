"""Files in and out: a JSON file read with one clear error line; atomic writes, so a reader (or a
crash) sees the old file or the new one, never half of one."""

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, TypeVar, Union

from bert_squad.errors import UserError

PathLike = Union[str, os.PathLike]


def read_text(path: PathLike, what: str = "a text file") -> str:
    """The file's UTF-8 text, or a UserError that names the file and what is wrong with it."""
    return _read(Path(path), what, lambda p: p.read_text(encoding="utf-8"))


def readable(path: PathLike, what: str = "a text file") -> Path:
    """`path`, a file this process can open for reading (nothing is read): checked before a command loads the
    libraries that read it, with `read_text`'s words otherwise."""
    return _read(Path(path), what, _opened)


def _opened(path: Path) -> Path:
    with open(path, "rb"):
        return path


Read = TypeVar("Read")


def _read(path: Path, what: str, reading: Callable[[Path], Read]) -> Read:
    """`reading(path)`, its errors one UserError each that names the file and what is wrong with it."""
    try:
        return reading(path)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, not {what}") from None
    except OSError as err:
        raise UserError(f"{path}: cannot read: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None


def read_json(path: PathLike, what: str = "a JSON file") -> Any:
    """The parsed file, or a UserError that names the file and what is wrong with it."""
    return parse_json(read_text(path, what), path)


def parse_json(text: str, where: PathLike) -> Any:
    """`text` parsed, or a UserError naming `where` (a file, or file:line) and what is wrong with it."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"{where}: malformed JSON at line {err.lineno} column {err.colno}: {err.msg}") from None
    except RecursionError:
        raise UserError(
            f"{where}: JSON nested deeper than the parser allows ({sys.getrecursionlimit()} levels)"
        ) from None


def directory(path: PathLike, given_as: str) -> Path:
    """`path`, given as `given_as` ("--cache-dir ", "BERT_SQUAD_CACHE="), for a directory a command will
    fill, checked before any work: an existing directory, or one that can be made because nothing on its
    way is a file. Nothing is created. A UserError naming the option and what is in the way otherwise."""
    path = Path(path)
    for part in (path, *path.parents):
        if part.is_dir():
            return path
        if part.exists():
            where = "" if part == path else f" ({part} is a file)"
            raise UserError(f"{given_as}{path}: not a directory{where}")
    return path


def scratch(folder: PathLike, name: str, directory: bool = False) -> Path:
    """A new file (or directory) `.name-XXXXXXXX` in `folder` that is this process's alone, to fill and then move
    into place or remove. The one rule for scratch where ranks, nodes or jobs meet (an output dir, the cache, a
    checkpoint): a PID names nothing of its own there (nodes booted alike, PID namespaces in containers), so
    the name is tempfile's, random and created exclusively. Its mode is what the umask gives any new file or
    directory (tempfile's own is the owner's alone), so what is moved out of it reads as other output does."""
    if directory:
        made = tempfile.mkdtemp(prefix=f".{name}-", dir=folder)
    else:
        fd, made = tempfile.mkstemp(prefix=f".{name}-", dir=folder)
        os.close(fd)
    return umask_mode(made)


def umask_mode(path: PathLike) -> Path:
    """`path` given the mode the umask gives a new file or directory (0644 / 0755 under umask 022): for what a
    library wrote owner-only (tempfile, safetensors), before it is moved where teammates read it."""
    umask = os.umask(0)  # read by setting it: the one way besides /proc
    os.umask(umask)
    os.chmod(path, (0o777 if os.path.isdir(path) else 0o666) & ~umask)
    return Path(path)


def probe_write(path: PathLike) -> None:
    """Create an empty file in the directory `path` and remove it: an OSError where the directory cannot be
    written, found before the work rather than after hours of it. Every rank probes the shared output dir at
    once: the file is `scratch`'s, no other process's."""
    scratch(path, "write-test").unlink()


def writable_directory(path: PathLike, given_as: str) -> Path:
    """Fail before the work, not after hours of it, when an output directory cannot be written: `directory`,
    then made (the first thing a command writes) and written to once."""
    directory(path, given_as)
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        probe_write(path)
    except OSError as err:
        raise UserError(f"{path}: output dir cannot be written ({err.strerror})") from None
    return Path(path)


def write_text_atomic(path: PathLike, text: str) -> None:
    path, tmp = Path(path), None
    try:
        tmp = scratch(path.parent, path.name)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as err:  # a directory in the way, no such parent, no permission: nothing left behind
        if tmp:
            tmp.unlink(missing_ok=True)
        raise UserError(f"{path}: cannot be written ({err.strerror or err})") from None


def write_json_atomic(path: PathLike, obj: Any, indent: int = 2) -> None:
    write_text_atomic(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")
