"""Files in and out: a JSON file read with one clear error line; atomic writes, so a reader (or a
crash) sees the old file or the new one, never half of one."""

import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
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


def umask() -> int:
    """The process's umask, read without changing it where the kernel says it (Linux 4.7 and later: "Umask:" in
    /proc/self/status): setting it to read it would give a file another thread creates in between mode 0666.
    Elsewhere it is set and set back, the one other way to read it."""
    with contextlib.suppress(OSError):
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    mask = os.umask(0o077)  # owner-only while it is read: a file made in between is too private, never too open
    os.umask(mask)
    return mask


def umask_mode(path: PathLike) -> Path:
    """`path` given the mode the umask gives a new file or directory (0644 / 0755 under umask 022): for what a
    library wrote owner-only (tempfile, safetensors), before it is moved where teammates read it."""
    os.chmod(path, (0o777 if os.path.isdir(path) else 0o666) & ~umask())
    return Path(path)


def probe_write(path: PathLike) -> None:
    """Create an empty file in the directory `path` and remove it: an OSError where the directory cannot be
    written, found before the work rather than after hours of it. Every rank probes the shared output dir at
    once: the file is `scratch`'s, no other process's."""
    scratch(path, "write-test").unlink()


def can_write(path: PathLike, given_as: str) -> Path:
    """`directory`'s check, then whether the directory can be written, or where it does not exist yet, the nearest
    one above it, in which it would be made: probed with a scratch file, removed at once. Nothing is left behind:
    for a check that a command's later work (a job's ranks, a download) will make the directory."""
    path = directory(path, given_as)
    existing = next(p for p in (path, *path.parents) if p.is_dir())
    try:
        probe_write(existing)
    except OSError as err:
        raise UserError(f"{path}: output dir cannot be written ({err.strerror})") from None
    return path


def remove_empty_dirs(root: PathLike) -> None:
    """Every directory below `root` that holds nothing, deepest first, and `root` itself where it is left empty:
    what a command that failed made and did not fill."""
    root = Path(root)
    if not root.is_dir():
        return
    for folder in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()  # only an empty one goes
    with contextlib.suppress(OSError):
        root.rmdir()


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


@contextlib.contextmanager
def undone_if_refused(folder: PathLike) -> Iterator[Callable[[], None]]:
    """What the body makes in `folder` (with `folder` and its parents, where they were not there) removed again
    where a UserError ends it before it calls the `keep` it is handed: a run refused once it has started (a
    DeepSpeed config its engine cannot be built of) leaves nothing behind, as one refused before it started."""
    folder = Path(folder)
    made = next((p for p in reversed((folder, *folder.parents)) if not p.exists()), None)  # the first to be made
    before = set() if made else set(os.listdir(folder))
    kept = False

    def keep() -> None:
        nonlocal kept
        kept = True

    try:
        yield keep
    except UserError:
        if not kept:  # every rank removes what it finds: another may have been first
            with contextlib.suppress(FileNotFoundError):
                _remove([made] if made else [folder / name for name in set(os.listdir(folder)) - before])
        raise


def _remove(paths: list[Path]) -> None:
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


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
